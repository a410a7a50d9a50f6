"""What the ASGI and WSGI tests check alike: the app's routes loaded by real HTTP requests, every figure
against what the client sent and received."""
import contextlib
import json
import random
import time
import uuid

import httpx

import instrument
from module_tree import expected_tree

DEPTH = 2
STREAM_CHUNKS = 5
TEXTS = [["a short sentence"], ["two sentences", "of different lengths, the second longer"], ["three"]] * 2


def embedder():
    """The MiniLM model the demo ships, and its tokenizer."""
    from transformers import AutoTokenizer

    from instrument.demo.service import load_model, model_dir
    return load_model("cpu"), AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)


@contextlib.contextmanager
def served_app(build_app, server):
    """build_app(model, tokenizer, spans) -> (the app to serve, its middleware), with the model under
    instrument.modules, served by `server`: yields what the tests read."""
    model, tokenizer = embedder()
    spans = []
    app, middleware = build_app(model, tokenizer, spans)
    handle = instrument.modules(model, depth=DEPTH)
    try:
        with server(app) as url:
            yield {"url": url, "model": model, "middleware": middleware, "handle": handle, "spans": spans}
    finally:
        handle.remove()


def settled(requests, timeout=30):
    """A snapshot once the root stages hold `requests` calls: a server ends a request (the app returns, the
    body is closed) just after the client has read the response, so the last one can still be open."""
    deadline = time.monotonic() + timeout
    while True:
        snap = instrument.snapshot()
        if sum(s.calls for s in snap if len(s.path) == 1) >= requests or time.monotonic() > deadline:
            return snap
        time.sleep(0.01)


def client_of(service):
    return httpx.Client(base_url=service["url"], timeout=60, trust_env=False)


class Sent:
    """Per root stage name the test expects: requests, request and response body bytes, 4xx and 5xx answers."""

    def __init__(self):
        self.rows = {}

    def count(self, name, response, body=b""):
        row = self.rows.setdefault(name, [0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += len(body)
        row[2] += len(response.content)
        row[3] += 400 <= response.status_code < 500
        row[4] += response.status_code >= 500
        return response

    def begin(self, client, item_route):
        """After one warm-up request (not counted: the stages are reset), the /embed requests and ten
        /items/<random> requests, named `item_route`."""
        client.get("/items/warm-up")
        settled(1)
        instrument.reset()
        for t in TEXTS:
            body = json.dumps({"texts": t}).encode()
            r = self.count("POST /embed", client.post("/embed", content=body,
                                                      headers={"content-type": "application/json"}), body)
            assert r.status_code == 200 and r.json() == {"dim": 384}
        for _ in range(10):
            self.count(item_route, client.get(f"/items/{uuid.uuid4()}"))

    def check(self, model, item_route):
        """Root stages named by route, their calls, bytes and error classes; the app's stages and the model's
        modules nested under them.  Returns the snapshot."""
        snap = settled(sum(row[0] for row in self.rows.values()))
        st = {s.path: s for s in snap}
        assert {s.path[0] for s in snap} == set(self.rows)
        for name, (n, req_bytes, resp_bytes, c4, c5) in self.rows.items():
            s = st[(name,)]
            assert s.calls == n, name
            assert s.item_total("request_bytes") == (req_bytes or None), name
            assert s.item_total("response_bytes") == (resp_bytes or None), name
            assert s.item_total("http_4xx") == (c4 or None) and s.item_total("http_5xx") == (c5 or None), name
        assert st[(item_route, "lookup")].calls == self.rows[item_route][0]
        assert st[("POST /embed", "tokenize")].calls == len(TEXTS)
        modules = {s.path[1:]: s for s in snap if s.path[:2] == ("POST /embed", "BertModel")}
        assert set(modules) == expected_tree(model, DEPTH, "BertModel")
        assert all(s.calls == len(TEXTS) for s in modules.values())
        return snap


def random_paths(client, methods, name_of, n=10_000):
    """n requests of random methods and paths, 30 % of them /items/<random>; returns {expected name: count}.
    name_of(method, path is an item) gives the name the test expects."""
    rng = random.Random(27)
    expected = {}
    for _ in range(n):
        method, item = rng.choice(methods), rng.random() < 0.3
        path = f"/items/{uuid.uuid4().hex}" if item else "/" + "/".join(
            uuid.uuid4().hex[:rng.randint(1, 12)] for _ in range(rng.randint(1, 4)))
        assert client.request(method, path).status_code in (200, 404, 405)
        name = name_of(method, item)
        expected[name] = expected.get(name, 0) + 1
    snap = settled(n)
    assert {s.path[0]: s.calls for s in snap if len(s.path) == 1} == expected
    assert len(snap) <= 2 * len(methods) + 2   # the route stages and the user's one stage under the item route


def check_removed(service, client):
    """After remove() of the modules' handle and the middleware, only the app's own stages record."""
    model = service["model"]
    service["handle"].remove()
    service["middleware"].remove()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert client.post("/embed", json={"texts": ["still served"]}).json() == {"dim": 384}
    assert client.get("/items/1").status_code == 200
    assert {s.path for s in instrument.snapshot()} == {("lookup",), ("tokenize",)}
