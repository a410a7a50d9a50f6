"""The server of a running process: /metrics and /snapshot over real HTTP on 127.0.0.1,
read-only, 404 for other paths, the workers' merge under PROMETHEUS_MULTIPROC_DIR,
and the `serve` option starting, moving and stopping it."""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import instrument  # noqa: E402
from instrument.serve import metrics  # noqa: E402
from snapfactory import env, snap, st  # noqa: E402


def parse(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fam, suffix, path):
    return [s for s in fam.samples if s.name == fam.name + suffix and s.labels["path"] == path]


def test_serve_metrics_answers_http_get(backend):
    with instrument.stage("served"):
        pass
    server = instrument.serve_metrics(0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        fams = parse(body)
        assert samples(fams["instrument_stage_duration_seconds"], "_count", "served")[0].value == 1
    finally:
        server.shutdown()
        server.server_close()


WORKER = """
import sys, instrument
from instrument.serve import multiproc
multiproc.start_snapshot_writer(sys.argv[1], interval=0.02, source=instrument.snapshot)
for _ in range(int(sys.argv[2])):
    with instrument.stage("handle"):
        with instrument.stage("parse"):
            pass
if sys.argv[3] == "stay":
    print("ready", flush=True)
    sys.stdin.read()          # stays alive until the test closes stdin: only the periodic save can show its work
"""


def test_multiprocess_collector_merges_worker_snapshots(tmp_path, monkeypatch):
    d = tmp_path / "prom"
    d.mkdir()
    code = ["-c", WORKER, str(d)]
    for n in (3, 5, 7):
        r = subprocess.run([sys.executable, *code, str(n), "exit"], capture_output=True, text=True, env=env(),
                           timeout=120)
        assert r.returncode == 0, r.stderr
    live = subprocess.Popen([sys.executable, *code, "11", "stay"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env())
    try:
        assert live.stdout.readline().strip() == "ready"
        coll = metrics.multiprocess_collector(str(d))
        deadline = time.monotonic() + 60
        while True:
            fams = {f.name: f for f in coll.collect()}
            got = samples(fams["instrument_stage_duration_seconds"], "_count", "handle/parse")
            if got and got[0].value == 3 + 5 + 7 + 11 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert got[0].value == 26
        assert [s.value for s in fams["instrument_processes"].samples] == [4]
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(d))   # serve_metrics then serves the merge
        server = instrument.serve_metrics(0)
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=30).read()
            h = parse(body.decode())["instrument_stage_duration_seconds"]
            assert samples(h, "_count", "handle")[0].value == 26
        finally:
            server.shutdown()
            server.server_close()
    finally:
        live.stdin.close()
        live.wait(timeout=60)
    assert len(os.listdir(d)) == 4


# ---------------------------------------------------------------- /snapshot
def get(url, method="GET", data=None):
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


@pytest.fixture
def served(backend):
    server = instrument.serve_metrics(0)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_snapshot_endpoint_serves_the_live_snapshot_read_only(served):
    instrument.configure(trace_events=1000)
    for _ in range(7):
        with instrument.stage("req"):
            with instrument.stage("tok"):
                pass
    status, ctype, body = get(served + "/snapshot")
    assert status == 200 and ctype == "application/json"
    snapd = instrument.Snapshot.from_dict(json.loads(body))
    assert snapd["req"].calls == 7 and snapd["req/tok"].calls == 7
    assert snapd.meta["pid"] == os.getpid()
    assert "events" not in json.loads(body) and instrument.snapshot().events   # the trace ring is not sent
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, _, _ = get(served + "/snapshot", method, data=b'{"reset": true}')
        assert status == 405, method
        assert get(served + "/metrics", method, data=b"x")[0] == 405
    assert get(served + "/snapshot", "HEAD")[:2] == (200, "application/json")
    assert instrument.snapshot()["req"].calls == 7   # no request changed anything
    assert get(served + "/snapshot/")[0] == 200


def test_other_paths_are_not_found(served):
    """Only /metrics and /snapshot answer: a scraper or browser pointed at another path learns it is wrong."""
    with instrument.stage("a"):
        pass
    for path in ("/", "/metric", "/metricsx", "/snapshot/extra", "/favicon.ico", "/index.html"):
        status, ctype, body = get(served + path)
        assert (status, ctype) == (404, "text/plain"), path
        assert body == b"not found: instrument serves /metrics and /snapshot\n" and b"instrument_stage" not in body
        assert get(served + path, "HEAD")[:2] == (404, "text/plain")
    for path in ("/metrics", "/metrics/"):
        status, ctype, body = get(served + path)
        assert status == 200 and ctype.startswith("text/plain")
        assert samples(parse(body.decode())["instrument_stage_duration_seconds"], "_count", "a")[0].value == 1


def test_snapshot_endpoint_bounds_its_answer(served, monkeypatch):
    with instrument.stage("a"):
        pass
    monkeypatch.setattr(metrics, "MAX_SNAPSHOT_BYTES", 200)
    status, ctype, body = get(served + "/snapshot")
    assert status == 503 and ctype == "application/json"
    assert "over the 200 bytes /snapshot sends" in json.loads(body)["error"]
    assert get(served + "/metrics")[0] == 200


def test_a_failing_source_is_an_answer_not_a_dead_server():
    calls = []

    def source():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("backend went away")
        return snap(st("a", 2, 1000))
    server = metrics.serve_metrics(0, source=source)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/snapshot"
        status, _, body = get(url)
        assert status == 500 and json.loads(body)["error"] == "RuntimeError: backend went away"
        status, _, body = get(url)
        assert status == 200 and json.loads(body)["stages"][0]["calls"] == 2
    finally:
        server.shutdown()
        server.server_close()


def test_serve_metrics_refuses_bad_arguments():
    with pytest.raises(ValueError, match="port must be an integer from 0 to 65535"):
        metrics.serve_metrics(70000, source=instrument.snapshot)
    with pytest.raises(TypeError, match="source must be a function"):
        metrics.serve_metrics(0, source=42)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVE = """
import json, sys, urllib.request, instrument
with instrument.stage("boot"):
    pass
print(json.dumps({"serve": instrument.current_config().serve}), flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("address,any_host,served_at", [
    ("127.0.0.1:{port}", None, True), (":{port}", None, True), ("0.0.0.0:{port}", None, False),
    ("0.0.0.0:{port}", "1", True)])
def test_instrument_serve_starts_the_server_at_import_on_loopback_only(address, any_host, served_at):
    port = free_port()
    e = env()
    e["INSTRUMENT_SERVE"] = address.format(port=port)
    if any_host:
        e["INSTRUMENT_SERVE_ANY_HOST"] = any_host
    proc = subprocess.Popen([sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=e)
    try:
        line = json.loads(proc.stdout.readline())
        if served_at:
            status, _, body = get(f"http://127.0.0.1:{port}/snapshot")
            assert status == 200 and json.loads(body)["stages"][0]["path"] == ["boot"]
        else:
            assert line["serve"] is None
            with pytest.raises(urllib.error.URLError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/snapshot", timeout=5)
    finally:
        proc.stdin.close()
        err = proc.stderr.read()
        proc.wait(timeout=60)
    if not served_at:
        assert "is not a loopback address" in err and "INSTRUMENT_SERVE_ANY_HOST=1" in err
    else:
        assert "Traceback" not in err


def test_configure_serve_starts_moves_and_stops_the_server(backend):
    port = free_port()
    try:
        instrument.configure(serve=f"127.0.0.1:{port}")
        with instrument.stage("x"):
            pass
        assert json.loads(get(f"http://127.0.0.1:{port}/snapshot")[2])["stages"][0]["calls"] == 1
        with pytest.raises(ValueError, match="not a loopback address"):
            instrument.configure(serve="10.1.2.3:80")
        assert get(f"http://127.0.0.1:{port}/snapshot")[0] == 200   # the refused change changed nothing
    finally:
        instrument.configure(serve=None)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/snapshot", timeout=5)


def test_a_busy_port_is_a_warning_not_an_exception(backend):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.warns(RuntimeWarning, match="cannot serve /metrics and /snapshot"):
            instrument.configure(serve=f"127.0.0.1:{s.getsockname()[1]}")
    instrument.configure(serve=None)


