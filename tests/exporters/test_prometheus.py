import os
import subprocess
import sys
import time
import urllib.request

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import instrument  # noqa: E402
from instrument.exporters import prometheus as P  # noqa: E402
from snapfactory import env, snap, st  # noqa: E402

VALUES = [5, 63, 64, 1023, 1024, 1025, 2047, 2048, 70_000, 1_000_000, 1_048_575, 1_048_576, 123_456_789, 10 ** 12]


def parse(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fam, suffix, path):
    return [s for s in fam.samples if s.name == fam.name + suffix and s.labels["path"] == path]


def test_histogram_counts_are_exact_and_monotone():
    s = snap(st("request", 0, 0, values=VALUES, cpu_ns=5_000, errors=2,
                counters={"page-faults": {"total": 42}, "cycles": {"total": None}}),
             st("request/tokenize", 3, 2_000_000))
    fams = parse(P.text(s))
    h = fams["instrument_stage_duration_seconds"]
    (count,) = samples(h, "_count", "request")
    assert count.value == len(VALUES) and count.labels["stage"] == "request"
    (total,) = samples(h, "_sum", "request")
    assert total.value == pytest.approx(sum(VALUES) / 1e9)
    buckets = samples(h, "_bucket", "request")
    les = [b.labels["le"] for b in buckets]
    assert les[-1] == "+Inf" and buckets[-1].value == len(VALUES)
    counts = [b.value for b in buckets]
    assert counts == sorted(counts)
    for b in buckets[:-1]:   # exact: what the raw values say for le = 2**k - 1 ns
        assert b.value == sum(v <= float(b.labels["le"]) * 1e9 + 0.5 for v in VALUES), b.labels["le"]
    (tok,) = samples(h, "_count", "request/tokenize")
    assert tok.value == 3 and tok.labels["stage"] == "tokenize"
    assert samples(fams["instrument_stage_errors"], "_total", "request")[0].value == 2
    assert samples(fams["instrument_stage_cpu_seconds"], "_total", "request")[0].value == pytest.approx(5e-6)
    (pf,) = samples(fams["instrument_stage_perf_events"], "_total", "request")
    assert pf.labels["event"] == "page-faults" and pf.value == 42   # a counter that never counted is left out


def test_live_snapshot_counts(backend):
    for _ in range(37):
        with instrument.stage("req"):
            with instrument.stage("tok"):
                pass
    fams = parse(P.text(instrument.snapshot()))
    h = fams["instrument_stage_duration_seconds"]
    assert samples(h, "_count", "req/tok")[0].value == 37
    assert samples(h, "_bucket", "req/tok")[-1].value == 37


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


def test_textfile(tmp_path):
    P.write_textfile(str(tmp_path / "m.prom"), snap(st("a", 4, 1000)))
    fams = parse((tmp_path / "m.prom").read_text())
    assert samples(fams["instrument_stage_duration_seconds"], "_count", "a")[0].value == 4


WORKER = """
import sys, instrument
from instrument.exporters import prometheus
prometheus.start_snapshot_writer(sys.argv[1], interval=0.02, source=instrument.snapshot)
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
        coll = P.multiprocess_collector(str(d))
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


def test_cli_export_prometheus(tmp_path, capsys):
    from instrument import cli
    snap(st("a", 2, 1000)).save(tmp_path / "a.json")
    snap(st("a", 3, 1000), pid=2).save(tmp_path / "b.json")
    assert cli.main(["export", "--prometheus", str(tmp_path / "m.prom"), str(tmp_path / "a.json"),
                     str(tmp_path / "b.json")]) == 0
    fams = parse((tmp_path / "m.prom").read_text())
    assert samples(fams["instrument_stage_duration_seconds"], "_count", "a")[0].value == 5
