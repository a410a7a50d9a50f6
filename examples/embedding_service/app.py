"""A small embedding service on the demo's EmbeddingService, instrumented per stage.

    uvicorn app:app --app-dir examples/embedding_service --host 127.0.0.1 --port 8000

EMBED_VARIANT=baseline|optimized (default optimized), EMBED_DEVICE=cpu|cuda (default cpu).
"""
import os
from contextlib import asynccontextmanager
from typing import List

from fastapi import FastAPI, HTTPException
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
    yield


app = FastAPI(title="instrument embedding example", lifespan=lifespan)


def metrics_text() -> str:
    """Prometheus text exposition of this process's stages, from the SDK's exporter."""
    from instrument.exporters import prometheus
    return prometheus.render(instrument.snapshot())


@app.post("/embed")
def embed(body: EmbedRequest):
    if not body.texts or len(body.texts) > MAX_TEXTS:
        raise HTTPException(422, f"send between 1 and {MAX_TEXTS} texts")
    vectors = app.state.service.embed(body.texts)
    return {"model": "all-MiniLM-L6-v2", "dim": vectors.shape[1], "embeddings": vectors.tolist()}


@app.get("/metrics", response_class=PlainTextResponse)
def metrics():
    return PlainTextResponse(metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")


@app.get("/debug/instrument")
def debug_instrument():
    return instrument.snapshot().to_dict()


@app.get("/healthz")
def healthz():
    return {"ok": True}
