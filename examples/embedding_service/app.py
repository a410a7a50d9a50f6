"""A small embedding service on the demo's EmbeddingService, instrumented per stage.

    uvicorn app:app --app-dir examples/embedding_service --host 127.0.0.1 --port 8000

EMBED_VARIANT=baseline|optimized (default optimized), EMBED_DEVICE=cpu|cuda (default cpu).
Under gunicorn with PROMETHEUS_MULTIPROC_DIR set, each worker keeps its snapshot in
that folder after every request, and /metrics and /snapshot serve the merge of all
workers (those killed included).
"""
import os
from contextlib import asynccontextmanager
from typing import List

from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

import instrument
from instrument.demo.service import EmbeddingService

MAX_TEXTS = 64  # one request is one batch; bound it like a real service would


class EmbedRequest(BaseModel):
    texts: List[str]


@asynccontextmanager
async def lifespan(app):
    service = EmbeddingService(os.environ.get("EMBED_VARIANT", "optimized"), os.environ.get("EMBED_DEVICE", "cpu"))
    service.encode(["warm up the model once"])  # unstaged, so stage counts equal the requests served
    app.state.service = service
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        instrument.start_snapshot_writer()   # this worker's file, rewritten after every request
    yield


app = FastAPI(title="instrument embedding example", lifespan=lifespan)


def service_snapshot() -> instrument.Snapshot:
    """This process's stages, or with PROMETHEUS_MULTIPROC_DIR the merge of every worker's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from instrument.serve import multiproc
        return multiproc.merged_snapshot()
    return instrument.snapshot()


def metrics_text() -> str:
    """Prometheus text exposition of the service's stages, from the SDK's exporter."""
    from instrument.exporters import prometheus
    return prometheus.render([service_snapshot()])


@app.post("/embed")
def embed(body: EmbedRequest, response: Response):
    if not body.texts or len(body.texts) > MAX_TEXTS:
        raise HTTPException(422, f"send between 1 and {MAX_TEXTS} texts")
    vectors = app.state.service.embed(body.texts)
    response.headers["X-Worker-Pid"] = str(os.getpid())
    return {"model": "all-MiniLM-L6-v2", "dim": vectors.shape[1], "embeddings": vectors.tolist()}


@app.get("/metrics", response_class=PlainTextResponse)
def metrics():
    return PlainTextResponse(metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")


@app.get("/snapshot")
def snapshot():
    """The snapshot as JSON, as instrument.serve_metrics serves it: `instrument top 127.0.0.1:8000` reads it."""
    from instrument.serve import metrics
    return Response(metrics.snapshot_body(service_snapshot()), media_type="application/json")


@app.get("/debug/instrument")
def debug_instrument():
    return instrument.snapshot().to_dict()


@app.get("/healthz")
def healthz():
    return {"ok": True}
