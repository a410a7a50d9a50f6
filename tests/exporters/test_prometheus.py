import os
import subprocess
import sys
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
    fams = parse(P.render([s]))
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
    fams = parse(P.render([instrument.snapshot()]))
    h = fams["instrument_stage_duration_seconds"]
    assert samples(h, "_count", "req/tok")[0].value == 37
    assert samples(h, "_bucket", "req/tok")[-1].value == 37


def test_textfile(tmp_path):
    P.write_textfile(str(tmp_path / "m.prom"), snap(st("a", 4, 1000)))
    fams = parse((tmp_path / "m.prom").read_text())
    assert samples(fams["instrument_stage_duration_seconds"], "_count", "a")[0].value == 4


def test_cli_export_prometheus(tmp_path, capsys):
    from instrument import cli
    snap(st("a", 2, 1000)).save(tmp_path / "a.json")
    snap(st("a", 3, 1000), pid=2).save(tmp_path / "b.json")
    assert cli.main(["export", "--prometheus", str(tmp_path / "m.prom"), str(tmp_path / "a.json"),
                     str(tmp_path / "b.json")]) == 0
    fams = parse((tmp_path / "m.prom").read_text())
    assert samples(fams["instrument_stage_duration_seconds"], "_count", "a")[0].value == 5


# ------------------------------------------------- conformance (promtool, the reference linter)
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import urllib.error  # noqa: E402

from instrument.snapshot import StageStats, path_text  # noqa: E402

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install "
                                                             "prometheus; .ci/run installs it)")
WEIRD = ['quote"d', "back\\slash", "new\nline", "日本語 ステージ", "{le=\"1\"}", "tab\there"]


def rich_snapshot():
    """Every field the exporter knows: counters (counts and clocks, one that never counted), GPU time,
    errors, '(other)', and stage names that need escaping."""
    ctr = {"page-faults": {"total": 42, "self": 40, "counted_calls": 3}, "task-clock": {"total": 7_000_000},
           "context-switches": {"total": 3}, "cycles": {"total": None}, "r01c2": {"total": 12345}}
    stages = [st("request", 0, 0, values=VALUES, cpu_ns=5_000, errors=2, counters=ctr),
              st("request/tokenize", 3, 2_000_000), st("request/(other)", 4, 10_000)]
    stages[-1] = StageStats(**{**stages[-1].__dict__, "other": True})
    gpu = {"total_ns": 3_000_000, "samples": 5, "dropped": 0, "errors": 0, "hist": {"scheme": "log2-64", "buckets": []}}
    mem = {src: {"calls": 4, "overlapped": 1, "marked": 0, "fresh": 4, "peak_max": 3 * 2 ** 20, "w": 4, "w_peak": 8 * 2 ** 20,
                 "w_net": -4096, "peak_sum": 8 * 2 ** 20, "peak_sq": 18 * 2 ** 40, "net_sum": -4096,
                 "net_sq": 4096 ** 2} for src in ("host", "cuda:0", "cuda:0:reserved")}
    stages.append(StageStats(**{**st("request/forward", 5, 1_000_000).__dict__, "gpu": gpu, "memory": mem}))
    stages += [st(f"request/{w}", 1, 1000) for w in WEIRD]
    s = snap(*stages)
    return type(s)(s.stages, dict(s.meta, distributed={"rank": 3, "world_size": 4}))   # one rank of a job


def promtool_check(text):
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


@needs_promtool
def test_promtool_clean_on_a_rich_export(tmp_path):
    from instrument import cli
    rich_snapshot().save(tmp_path / "run.json")
    assert cli.main(["export", "--prometheus", str(tmp_path / "m.prom"), str(tmp_path / "run.json")]) == 0
    text = (tmp_path / "m.prom").read_text()
    rc, out = promtool_check(text)
    assert (rc, out) == (0, ""), out
    fams = parse(text)
    assert set(fams) == set(P.FAMILIES)   # every family present, no other
    gpu = samples(fams["instrument_stage_gpu_seconds"], "_total", "request/forward")
    assert gpu[0].value == pytest.approx(0.003)
    assert samples(fams["instrument_stage_gpu_samples"], "_total", "request/forward")[0].value == 5
    assert samples(fams["instrument_stage_errors"], "_total", "request")[0].value == 2
    clock = samples(fams["instrument_stage_perf_clock_seconds"], "_total", "request")
    assert [(c.labels["event"], c.value) for c in clock] == [("task-clock", pytest.approx(0.007))]   # seconds
    events = {c.labels["event"]: c.value for c in samples(fams["instrument_stage_perf_events"], "_total", "request")}
    assert events == {"page-faults": 42, "context-switches": 3, "r01c2": 12345}   # cycles never counted: absent
    other = samples(fams["instrument_stage_duration_seconds"], "_count", "request/(other)")
    assert other[0].value == 4 and other[0].labels["stage"] == "(other)"


@needs_promtool
def test_label_values_are_escaped_and_read_back_exactly():
    text = P.render([rich_snapshot()])
    assert promtool_check(text) == (0, "")
    h = parse(text)["instrument_stage_duration_seconds"]
    names = {s.labels["stage"] for s in h.samples}
    assert set(WEIRD) <= names
    for w in WEIRD:
        assert samples(h, "_count", path_text(("request", w)))[0].value == 1
    assert '\\"' in text and "\\\\" in text and "\\n" in text and "\n\t" not in text


@needs_promtool
def test_served_metrics_are_promtool_clean(backend):
    instrument.configure(counters=["task-clock", "page-faults", "context-switches"])
    for w in ["request", *WEIRD]:
        with instrument.stage("request"):
            with instrument.stage(w):
                pass
    try:
        with instrument.stage("fails"):
            raise KeyError("x")
    except KeyError:
        pass
    server = instrument.serve_metrics(0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=30).read()
    finally:
        server.shutdown()
        server.server_close()
    text = body.decode()
    assert promtool_check(text) == (0, "")
    fams = parse(text)
    assert samples(fams["instrument_stage_errors"], "_total", "fails")[0].value == 1
    assert samples(fams["instrument_stage_duration_seconds"], "_count", "request")[0].value == 1 + len(WEIRD)


CAPPED = """
import json, warnings, instrument
from instrument.exporters import prometheus as P
from prometheus_client.parser import text_string_to_metric_families
instrument.configure(max_stages=12)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for i in range(500):
        with instrument.stage("request"):
            with instrument.stage(f"user-{i}"):
                pass
(h,) = [f for f in text_string_to_metric_families(P.render([instrument.snapshot()]))
        if f.name == "instrument_stage_duration_seconds"]
counts = [s for s in h.samples if s.name.endswith("_count") and s.labels["path"] != "request"]
print(json.dumps({"paths": sorted({s.labels["path"] for s in h.samples}),
                  "folded": any("folded" in str(x.message) for x in w), "children": sum(s.value for s in counts)}))
"""


@pytest.mark.parametrize("pure", ["0", "1"])
def test_label_cardinality_is_bounded_by_the_stage_cap(pure):
    # in a process of its own: the fold warning is shown once per process
    r = subprocess.run([sys.executable, "-c", CAPPED], capture_output=True, text=True, timeout=120,
                       env=dict(env(), INSTRUMENT_PURE_PYTHON=pure))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert len(got["paths"]) == 12 + 1 and "request/(other)" in got["paths"]   # the cap, and one (other)
    assert got["folded"] and got["children"] == 500                              # every call still counted


def documented_metrics():
    """The metric table of docs/prometheus.md: name -> (type, labels, unit)."""
    text = open(os.path.join(os.path.dirname(P.__file__), "..", "..", "docs", "prometheus.md")).read()
    rows = re.findall(r"^\| `(instrument_[a-z_]+)` \| (\w+) \| ([^|]*) \| ([^|]*) \|", text, re.M)
    return {n: (t, sorted(re.findall(r"`(\w+)`", labels)), unit.strip()) for n, t, labels, unit in rows}


def test_docs_list_every_metric_with_its_labels_and_unit():
    docs = documented_metrics()
    exported = set(parse(P.render([rich_snapshot()])))
    for name, (kind, extra, unit, _help) in P.FAMILIES.items():
        full = name + "_total" if kind == "counter" else name
        assert full in docs, f"{full} is not in docs/prometheus.md"
        labels = [] if extra is None else sorted(P.LABELS + extra + (["le"] if kind == "histogram" else []))
        assert docs[full] == (kind, labels, unit), full
        assert name in exported
    assert len(docs) == len(P.FAMILIES)


@needs_promtool
def test_cpu_time_by_mode_adds_up_and_lints(tmp_path):
    from dataclasses import replace
    ms = 1_000_000
    s = snap(replace(st("alloc", 40, 10 * ms, cpu_ns=400 * ms), cpu_sys_total=300 * ms, cpu_sys_self=300 * ms),
             st("plain", 10, ms, cpu_ns=9 * ms))          # no system time measured: no mode series
    text = P.render([s])
    assert promtool_check(text) == (0, "")
    got = {(smp.name, smp.labels["path"], smp.labels.get("mode")): smp.value
           for f in text_string_to_metric_families(text) for smp in f.samples
           if f.name in ("instrument_stage_cpu_mode_seconds", "instrument_stage_cpu_seconds")}
    assert got[("instrument_stage_cpu_mode_seconds_total", "alloc", "system")] == pytest.approx(0.3)
    assert got[("instrument_stage_cpu_mode_seconds_total", "alloc", "user")] == pytest.approx(0.1)
    assert got[("instrument_stage_cpu_seconds_total", "alloc", None)] == pytest.approx(0.4)
    assert not any(k[1] == "plain" and k[2] for k in got)


@needs_promtool
@pytest.mark.native_only   # blocked time needs run-queue time, the interval a sampled estimate: the C core's
def test_wall_split_and_cpu_interval_of_a_live_stage(backend):
    """A live stage that sleeps and spins: its own wall time by component adds up to its self seconds, the sleep
    shows as blocked (at least what time.sleep asked for), and a sampled stage's CPU carries its interval."""
    import time
    st_ = instrument.stage("mixed")
    for _ in range(20):
        with st_:
            time.sleep(0.002)
            t = time.thread_time_ns()
            while time.thread_time_ns() - t < 500_000:
                pass
    tiny = instrument.stage("tiny")
    for _ in range(20_000):
        with tiny:
            pass
    s = instrument.snapshot()
    text = P.render([s])
    assert promtool_check(text) == (0, "")
    fams = parse(text)
    split = {smp.labels["component"]: smp.value for smp in fams["instrument_stage_wall_split_seconds"].samples
             if smp.labels["path"] == "mixed" and smp.name.endswith("_total")}
    assert set(split) <= set(P.SPLIT) and sum(split.values()) == pytest.approx(s["mixed"].wall_self / 1e9, rel=1e-6)
    assert split["blocked"] + split.get("runqueue", 0) >= 20 * 0.002
    err = {smp.labels["path"]: smp.value for smp in fams["instrument_stage_cpu_error_seconds"].samples}
    assert s["tiny"].cpu_estimated and err["tiny"] > 0
    assert err["tiny"] == pytest.approx(2.5758 * s["tiny"].cpu_var ** 0.5 / 1e9, rel=1e-3)
