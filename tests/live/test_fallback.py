"""The pure-Python fallback (instrument.live.pure): every call read, exact sums against independent clocks and the
kernel's own counts, the same snapshot schema as the C core, NVTX ranges a tool receives, and a meta.backend that
says what it lacks."""
import json
import textwrap
import threading
import time

import numpy as np
import pytest

import instrument
from conftest import _native, run_python
from instrument import histogram
from instrument.live import collector, doctor, pure
from instrument.exporters import table
from test_budget import minor_faults, touch_pages


def test_every_call_and_its_wall_time_within_the_clock_around_it(fallback):
    """Each call's wall time lies between the body's own perf_counter window and the one around the with-block;
    the sums, min and max follow exactly."""
    st, inner, outer = instrument.stage("w"), [], []
    for k in range(200):
        a = time.perf_counter_ns()
        with st:
            b = time.perf_counter_ns()
            sum(range(50 * (k % 7)))
            inner.append(time.perf_counter_ns() - b)
        outer.append(time.perf_counter_ns() - a)
    s = instrument.snapshot()["w"]
    assert s.calls == 200 and s.errors == 0
    assert sum(inner) <= s.wall_total <= sum(outer)
    assert min(inner) <= s.wall_min <= min(outer) and max(inner) <= s.wall_max <= max(outer)


def test_cpu_time_within_the_thread_clock_around_it(fallback):
    """CPU time from the thread's CPU clock: the stage's total lies between the clock's advance in its bodies and
    around its with-blocks; every call read, nothing estimated."""
    instrument.configure(counters=())
    st, inner, outer = instrument.stage("spin"), 0, 0
    for _ in range(50):
        a = time.thread_time_ns()
        with st:
            b = time.thread_time_ns()
            sum(range(20_000))
            inner += time.thread_time_ns() - b
        outer += time.thread_time_ns() - a
    s = instrument.snapshot()["spin"]
    assert inner <= s.cpu_total <= outer
    assert s.cpu_calls == 50 and not s.cpu_estimated and s.cpu_var == 0


def test_page_faults_are_the_kernels_count(fallback):
    """The perf page-faults counter (the ctypes group) of a stage touching fresh pages lies between the thread's
    minor-fault count (getrusage) in its bodies and around them, and is at least the pages touched."""
    instrument.configure(counters="page-faults")
    snap0 = instrument.snapshot()
    if not snap0.meta["counters"]["events"]["page-faults"].get("available", True):
        pytest.skip("page-faults cannot be opened here")
    st, inner, outer = instrument.stage("touch"), 0, 0
    for _ in range(20):
        a = minor_faults()
        with st:
            b = minor_faults()
            touch_pages(64)
            inner += minor_faults() - b
        outer += minor_faults() - a
    c = instrument.snapshot()["touch"].counters["page-faults"]
    assert 20 * 64 <= inner <= c["total"] <= outer
    assert c["read_calls"] == c["counted_calls"] == 20 and not c["estimated"] and c["var"] == 0


def test_histogram_is_numpys_of_the_calls_wall_times(fallback):
    """The histogram holds every call in the bucket of its wall time: numpy's histogram of the trace ring's
    durations over the scheme's bucket edges gives the same counts."""
    instrument.configure(trace_events=1000)
    st = instrument.stage("h")
    for k in range(500):
        with st:
            sum(range(k * 7 % 400))
    snap = instrument.snapshot()
    durs = np.array([e["dur_ns"] for e in snap.events])
    assert len(durs) == 500
    edges = [histogram.bounds(i)[0] for i in range(histogram.LAST + 1)] + [histogram.bounds(histogram.LAST)[1]]
    counts, _ = np.histogram(durs, bins=np.array(edges, dtype=np.float64))
    assert {i: int(c) for i, c in enumerate(counts) if c} == dict(snap["h"].hist)


def test_nesting_self_time_and_items_add_up_exactly(fallback):
    with instrument.stage("outer"):
        for _ in range(3):
            with instrument.stage("inner"):
                instrument.add("tokens", 5)
                time.sleep(0.001)
        instrument.add("requests")
    snap = instrument.snapshot()
    outer, inner = snap["outer"], snap[("outer", "inner")]
    assert (outer.calls, inner.calls) == (1, 3)
    assert outer.wall_self == outer.wall_total - inner.wall_total
    assert outer.cpu_self == outer.cpu_total - inner.cpu_total
    assert inner.items["tokens"] == {"total": 15, "calls": 3} and outer.items["requests"] == {"total": 1, "calls": 1}
    assert instrument.live.backend.current.current_path() == ()


def test_threads_keep_their_own_stacks(fallback):
    """Eight threads, each nesting its own stages while the others do: every call lands under its own parent."""
    def work(k):
        for _ in range(100):
            with instrument.stage(f"t{k % 2}"):
                with instrument.stage("leaf"):
                    assert instrument.live.backend.current.current_path() == (f"t{k % 2}", "leaf")
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = instrument.snapshot()
    assert {s.path: s.calls for s in snap.stages} == {("t0",): 400, ("t1",): 400, ("t0", "leaf"): 400,
                                                      ("t1", "leaf"): 400}
    assert snap.meta["exits"] == {"unmatched_exits": 0, "out_of_order_exits": 0, "cross_thread_exits": 0}


def _keys(d, prefix=""):
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k not in ("items", "counters", "config", "events"):
            out |= _keys(v, prefix + k + ".")
    return out


@pytest.mark.skipif(_native is None, reason="C extension not built")
def test_the_snapshot_schema_is_the_c_cores(fallback):
    """The same workload on both backends gives the same to_dict() keys, stage by stage (exemplars aside)."""
    def record(module):
        collector.use_backend(module)
        instrument.reset()
        instrument.configure(counters="task-clock,page-faults", overhead_budget=None)
        with instrument.stage("a"):
            with instrument.stage("b"):
                instrument.add("n", 2)
                time.sleep(0.002)
        return instrument.snapshot().to_dict()
    native, fb = record(_native), record(pure)
    assert set(fb) <= set(native) and set(native) - set(fb) <= {"exemplars"}   # none kept: none written
    assert [s["path"] for s in fb["stages"]] == [s["path"] for s in native["stages"]]
    for a, b in zip(fb["stages"], native["stages"]):
        assert _keys(a) <= _keys(b), _keys(a) - _keys(b)
        lacking = _keys(b) - _keys(a)   # only what reads the quantities the fallback lacks (pure.MISSING)
        assert all(any(w in k for w in ("runqueue", "blocked", "gil", "helpers", "instrument", "memory"))
                   for k in lacking), lacking
    assert set(fb["meta"]) <= set(native["meta"]) | {"items_outside_stages"}


def test_meta_doctor_and_report_say_what_is_missing(fallback):
    with instrument.stage("a"):
        pass
    snap = instrument.snapshot()
    b = snap.meta["backend"]
    assert b["name"] == "pure" and b["reason"] and set(b["missing"]) == set(pure.MISSING)
    assert {"overhead budget", "estimates", "exemplars", "asyncio task attribution", "calibration"} <= set(b["missing"])
    assert "overhead" not in snap.meta and snap.exemplars == ()   # nothing measured of its own cost, nothing kept
    text = doctor.format_text(doctor.collect())
    assert "pure backend" in text and "lacks" in text and "estimates" in text
    footer = " ".join(table.render([snap], width=80).split())
    assert "recorded by the pure backend" in footer and "overhead budget" in footer
    assert pure.calibrate(3)["run_queue"] == pure.NOT_MEASURED


def test_overhead_budget_is_taken_and_every_call_still_read(fallback):
    instrument.configure(overhead_budget=0.5, counters="task-clock")
    assert pure.configuration()["overhead_budget"] == 0.5
    st = instrument.stage("short")
    for _ in range(300):
        with st:
            pass
    s = instrument.snapshot()["short"]
    assert s.calls == s.cpu_calls == 300 and s.cpu_read_calls is None and not s.cpu_estimated


def test_chosen_where_the_extension_is_missing_and_says_why():
    """A process whose import of instrument._native fails records through the fallback, and meta says why."""
    r = run_python(textwrap.dedent("""
        import json, sys
        sys.modules["instrument._native"] = None   # the extension cannot be imported
        import instrument
        with instrument.stage("a"):
            pass
        print(json.dumps(instrument.snapshot().meta["backend"]))
    """))
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout.strip().splitlines()[-1])
    assert b["name"] == "pure" and "C extension not importable" in b["reason"] and "estimates" in b["missing"]


def test_nvtx_ranges_reach_the_tool():
    """Stage ranges of the fallback, through live/nvtx.py, as the recording NVTX tool receives them."""
    from nvtx_support import nvtx_include_dir, pushpop_paths, run_recorded
    if nvtx_include_dir() is None:
        pytest.skip("NVTX headers (nvidia-nvtx) not installed")
    recs = run_recorded(textwrap.dedent("""
        import json, instrument
        instrument.configure(nvtx=True, nvtx_domain="instrument")
        for _ in range(3):
            with instrument.stage("a"):
                with instrument.stage("b"):
                    pass
        print(json.dumps([list(s.path) for s in instrument.snapshot().stages]))
    """), env={"INSTRUMENT_PURE_PYTHON": "1"})
    paths = pushpop_paths(recs, "instrument")   # balanced, or it raises
    assert sorted(paths) == [("a",)] * 3 + [("a", "b")] * 3
    assert {tuple(p) for p in json.loads(recs.stdout.strip().splitlines()[-1])} == {("a",), ("a", "b")}
