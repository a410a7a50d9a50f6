"""Items as Prometheus counters, and the slowest calls as OpenMetrics exemplars, read back by
prometheus_client's OpenMetrics parser and by a real Prometheus server with exemplar storage."""
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.openmetrics.parser import text_string_to_metric_families  # noqa: E402

import instrument  # noqa: E402
from instrument.exporters import prometheus as P  # noqa: E402
from instrument.snapshot import path_text  # noqa: E402
from snapfactory import cli  # noqa: E402

PROMETHEUS = shutil.which("prometheus")


def workload():
    instrument.configure(exemplars=8)
    req, pre, fwd = instrument.stage("request"), instrument.stage("pre"), instrument.stage("forward")
    for i in range(200):
        with req:
            with pre:
                if i % 25 == 4:
                    time.sleep(0.003)
            with fwd:
                instrument.add("tokens", 7)
    return instrument.snapshot()


def _top_stage(e):
    """The stage that took most of a kept call (request/pre unless the machine stalled another one longer)."""
    return path_text(max(e["breakdown"], key=lambda b: b["wall_ns"])["path"])


@pytest.mark.native_only   # exemplars: the C core's
def test_openmetrics_exemplars_and_item_counters(backend, tmp_path):
    s = workload()
    fams = {f.name: f for f in text_string_to_metric_families(P.render([s], openmetrics=True))}
    (tok,) = [x for x in fams["instrument_stage_items"].samples if x.name.endswith("_total")]
    assert tok.labels == {"stage": "forward", "path": "request/forward", "item": "tokens"} and tok.value == 1400
    hist = fams["instrument_stage_duration_seconds"]
    marked = [x for x in hist.samples if x.exemplar is not None]
    assert marked and all(x.labels["path"] == "request" for x in marked)
    slowest = max((e for e in s.exemplars if e["slow"]), key=lambda e: e["wall_ns"])
    top = max(marked, key=lambda x: x.exemplar.value)
    assert top.exemplar.value == pytest.approx(slowest["wall_ns"] / 1e9)
    assert top.exemplar.labels == {"call": f"{slowest['pid']}:{slowest['seq']}", "stage": _top_stage(slowest)}
    assert top.exemplar.value <= float(top.labels["le"])            # each in its own bucket
    assert len({x.labels["le"] for x in marked}) == len(marked)
    # the text format 0.0.4 has no exemplars, and the command line writes either
    assert " # {" not in P.render([s])
    s.save(tmp_path / "s.json")
    r = cli("export", "--prometheus", tmp_path / "m.txt", "--openmetrics", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m.txt").read_text().rstrip().endswith("# EOF")
    r = cli("export", "--chrome", tmp_path / "t.json", "--openmetrics", tmp_path / "s.json")
    assert r.returncode == 2 and "--openmetrics goes with --prometheus" in r.stderr


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus server is not installed (Debian: apt-get install "
                                               "prometheus; .ci/run installs it)")
def test_prometheus_server_stores_the_exemplars(tmp_path):
    s = workload()
    server = instrument.serve_metrics(0)
    port = _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: svc\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{server.server_port}']\n")
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--enable-feature=exemplar-storage", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=log)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        deadline = time.monotonic() + 90
        got = None
        while got is None:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "no exemplars stored within 90 s: " + \
                (tmp_path / "prometheus.log").read_text()[-2000:]
            q = urllib.parse.urlencode({"query": 'instrument_stage_duration_seconds_bucket{path="request"}',
                                        "start": f"{time.time() - 3600:.3f}", "end": f"{time.time() + 60:.3f}"})
            try:
                with opener.open(f"http://127.0.0.1:{port}/api/v1/query_exemplars?{q}", timeout=10) as r:
                    d = json.loads(r.read())
                if d["status"] == "success" and d["data"]:
                    got = d["data"]
            except OSError:
                pass
            time.sleep(0.5)
        stored = [e for series in got for e in series["exemplars"]]
        slowest = max((e for e in s.exemplars if e["slow"]), key=lambda e: e["wall_ns"])
        top = max(stored, key=lambda e: float(e["value"]))
        assert float(top["value"]) == pytest.approx(slowest["wall_ns"] / 1e9)
        assert top["labels"] == {"call": f"{slowest['pid']}:{slowest['seq']}", "stage": _top_stage(slowest)}
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        server.shutdown()
        server.server_close()
