"""Memory per stage (csrc/memory.h): peaks and net changes of the resident set and the traced Python heap, against
arrays and lists of known size, the process's own /proc/self/statm read around each call by the test, and
tracemalloc's own count; nesting, a user's reset inside a stage, another thread's overlapping call, a fork."""
import json
import tracemalloc

import numpy as np
import pytest

import instrument
from conftest import run_python
from instrument import _native
from instrument.snapshot import Snapshot

pytestmark = pytest.mark.native_only
MiB = 1 << 20


def _fresh_process(code):
    """Figures from a fresh interpreter: a resident set rises only for pages the allocator takes from the kernel,
    and a process that freed much before (this suite's) serves even a 64 MiB array from pages it still holds."""
    r = run_python("import json, os, threading, numpy as np, instrument\n"
                   "def touched(n): return np.ones(n, dtype=np.uint8)\n"
                   "def rss(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
                   "instrument.configure(memory='host')\n" + code +
                   "\nprint(json.dumps({s.name: s.memory_of('host') for s in instrument.snapshot()}))")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1]), r.stdout.splitlines()[:-1]


def test_rss_peak_and_net_of_known_arrays():
    """A stage that allocates and frees 64 MiB per call peaks at 64 MiB with no net change; one that keeps 32 MiB
    per call has a net of 32 MiB, as the resident set the test reads around each call says too; their parent's
    peak is the larger child's, its net the kept one's."""
    figs, out = _fresh_process("""
kept, truth = [], []
for _ in range(12):
    before = rss()
    with instrument.stage("req"):
        with instrument.stage("churn"):
            a = touched(64 << 20)
            del a
        with instrument.stage("keep"):
            kept.append(touched(32 << 20))
    truth.append(rss() - before)
print(sum(truth) / len(truth))""")
    truth = float(out[-1])
    churn, keep, req = figs["churn"], figs["keep"], figs["req"]
    for f in (churn, keep, req):
        assert f["calls"] >= 8 and f["overlapped"] == 0 and f["marked"] == 0
        assert f["peak_max"] >= f["peak_mean"] >= 0
    assert churn["peak_mean"] == pytest.approx(64 * MiB, rel=0.15)
    assert abs(churn["net_mean"]) < 0.15 * 64 * MiB
    assert keep["net_mean"] == pytest.approx(32 * MiB, rel=0.15)
    assert keep["net_mean"] == pytest.approx(truth, rel=0.15)   # the resident set, read by the test
    assert keep["peak_mean"] == pytest.approx(32 * MiB, rel=0.15)
    assert req["peak_mean"] == pytest.approx(64 * MiB, rel=0.15)
    assert req["net_mean"] == pytest.approx(32 * MiB, rel=0.15)
    assert req["net_total"] == pytest.approx(req["net_mean"] * 12)


def test_rss_a_parent_keeps_its_peak_through_its_children_s_resets():
    """The parent peaks at 96 MiB before its child opens; the child's enter resets the kernel's high-water mark,
    and the parent's peak is still 96 MiB (folded into it first), the child's its own 40 MiB."""
    figs, _ = _fresh_process("""
for _ in range(10):
    with instrument.stage("parent"):
        a = touched(96 << 20)
        del a
        with instrument.stage("child"):
            b = touched(40 << 20)
            del b""")
    assert figs["parent"]["peak_mean"] == pytest.approx(96 * MiB, rel=0.15)
    assert figs["child"]["peak_mean"] == pytest.approx(40 * MiB, rel=0.15)


def test_rss_a_foreign_reset_of_the_mark_is_marked():
    """A user's own write to /proc/self/clear_refs after freeing 64 MiB held from before the call: the mark is
    below what the SDK saw at enter, so the call is marked."""
    figs, _ = _fresh_process("""
held = touched(64 << 20)
with instrument.stage("frees"):
    del held
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
with instrument.stage("later"):
    pass""")
    assert figs["frees"]["marked"] == 1 and figs["frees"]["net_mean"] == pytest.approx(-64 * MiB, rel=0.15)
    assert figs["later"]["marked"] == 0


def test_rss_another_thread_s_stage_events_during_a_call_overlap_it():
    """A call during which another thread enters and exits stages is overlapped and kept apart (the gauges are the
    process's); a call beside another thread's call that stays open without a stage event is measured, and that
    open call, which saw the first one's events, is overlapped."""
    figs, _ = _fresh_process("""
inside, done, go, ticked = threading.Event(), threading.Event(), threading.Event(), threading.Event()
def idle():
    with instrument.stage("idle"):
        inside.set()
        done.wait(10)
def busy():
    go.wait(10)
    for _ in range(50):
        with instrument.stage("tick"):
            pass
    ticked.set()
t = threading.Thread(target=idle)
t.start()
inside.wait(10)
with instrument.stage("beside_idle"):
    a = touched(48 << 20)
    del a
done.set()
t.join()
b = threading.Thread(target=busy)
b.start()
with instrument.stage("beside_busy"):
    go.set()
    ticked.wait(10)
    a = touched(48 << 20)
    del a
b.join()""")
    assert (figs["beside_idle"]["calls"], figs["beside_idle"]["overlapped"]) == (1, 0)
    assert figs["beside_idle"]["peak_mean"] == pytest.approx(48 * MiB, rel=0.15)
    assert (figs["idle"]["calls"], figs["idle"]["overlapped"]) == (0, 1) and figs["idle"]["peak_mean"] is None
    assert (figs["beside_busy"]["calls"], figs["beside_busy"]["overlapped"]) == (0, 1)


def test_python_heap_net_of_a_million_ints_is_tracemalloc_s_own_count(backend):
    instrument.configure(memory="host,python")
    assert tracemalloc.is_tracing()
    t0 = tracemalloc.get_traced_memory()[0]
    truth_list = list(range(10 ** 6))
    truth = tracemalloc.get_traced_memory()[0] - t0
    kept = []
    for _ in range(3):
        with instrument.stage("build"):
            kept.append(list(range(10 ** 6)))
    f = instrument.snapshot()["build"].memory_of("python")
    assert f["calls"] == 3
    assert f["net_mean"] == pytest.approx(truth, rel=0.10)
    assert f["peak_mean"] >= f["net_mean"]
    del truth_list, kept
    instrument.configure(memory="host")
    assert not tracemalloc.is_tracing()   # started by instrument, stopped by it


def test_a_user_s_reset_inside_a_stage_is_held_and_marked(backend):
    """tracemalloc.reset_peak() inside a stage: the stage's peak is still the list it built and freed before it, and
    its calls are marked; a child opened after the reset has its own peak, unmarked."""
    instrument.configure(memory="python")
    for _ in range(5):
        with instrument.stage("outer"):
            t0 = tracemalloc.get_traced_memory()[0]
            big = list(range(300_000))
            size = tracemalloc.get_traced_memory()[0] - t0
            del big
            tracemalloc.reset_peak()
            with instrument.stage("inner"):
                small = [0] * 1000
                del small
    snap = instrument.snapshot()
    outer, inner = snap["outer"].memory_of("python"), snap["outer/inner"].memory_of("python")
    assert outer["marked"] == outer["calls"] == 5
    assert outer["peak_mean"] == pytest.approx(size, rel=0.05)
    assert inner["marked"] == 0 and inner["peak_mean"] < 0.01 * size


def test_rss_a_forked_child_measures_its_own_and_leaves_the_parent_s_mark_alone():
    """The child's resets are its own process's (its files opened again): the parent's open call, whose 64 MiB
    peak came before the fork, keeps it."""
    r = run_python("""
import os, numpy as np, instrument
instrument.configure(memory="host")
with instrument.stage("parent_call"):
    a = np.ones(64 << 20, dtype=np.uint8); del a
    pid = os.fork()
    if pid == 0:
        for _ in range(3):
            with instrument.stage("child_call"):
                b = np.ones(48 << 20, dtype=np.uint8); del b
        f = instrument.snapshot()["parent_call/child_call"].memory_of("host")
        os._exit(0 if abs(f["peak_mean"] - (48 << 20)) < 0.15 * (48 << 20) else 3)
    _, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), instrument.snapshot()["parent_call"].memory_of("host")["peak_mean"])
""")
    assert r.returncode == 0, r.stderr
    code, peak = r.stdout.split()
    assert code == "0"
    assert float(peak) == pytest.approx(64 * MiB, rel=0.15)


def test_figures_survive_save_load_since_and_merge(backend, tmp_path):
    """On the traced Python heap, which counts allocations whatever the allocator keeps."""
    instrument.configure(memory="python")
    for _ in range(4):
        with instrument.stage("s"):
            a = bytearray(40 * MiB)
            del a
    early = instrument.snapshot()
    kept = []
    for _ in range(4):
        with instrument.stage("s"):
            kept.append(bytearray(36 * MiB))
    late = instrument.snapshot()
    late.save(tmp_path / "late.json")
    loaded = Snapshot.load(tmp_path / "late.json")
    assert loaded["s"].memory_of("python") == pytest.approx(late["s"].memory_of("python"))
    window = late.since(early)["s"].memory_of("python")
    assert window["calls"] == late["s"].memory_of("python")["calls"] - early["s"].memory_of("python")["calls"]
    assert window["net_mean"] == pytest.approx(36 * MiB, rel=0.15)
    assert window["peak_max"] is None   # the window's peaks (36 MiB) never passed the earlier 40 MiB: not known
    both = early.merge(late.since(early))["s"].memory_of("python")
    assert both["calls"] == late["s"].memory_of("python")["calls"]
    assert both["net_mean"] == pytest.approx(late["s"].memory_of("python")["net_mean"])


def test_the_memory_option_says_what_is_allowed():
    with pytest.raises(ValueError, match="unknown memory source 'gpu'; the sources are host, python, cuda"):
        instrument.configure(memory="host,gpu")
    with pytest.raises(ValueError, match="none turns memory off"):
        instrument.configure(memory="none,host")
    instrument.configure(memory="none")
    assert [s["name"] for s in _native.memory_status() if s["active"]] == []
    with instrument.stage("s"):
        pass
    assert instrument.snapshot()["s"].memory is None


def test_the_fallback_says_it_measures_no_memory(fallback):
    instrument.configure(memory="host")
    with instrument.stage("s"):
        pass
    snap = instrument.snapshot()
    assert snap["s"].memory is None
    assert "memory per stage" in snap.meta["backend"]["missing"]
    assert snap.meta["memory"]["sources"] == []


def test_rss_a_stage_that_touches_fresh_memory_says_so_and_one_that_reuses_a_buffer_does_not():
    r = run_python("""
import json, numpy as np, instrument
from instrument.analysis.advice import advise
instrument.configure(memory="host")
buf = np.empty(64 << 20, dtype=np.uint8)
for _ in range(10):
    with instrument.stage("request"):
        with instrument.stage("fresh"):
            a = np.ones(64 << 20, dtype=np.uint8); del a
        with instrument.stage("reused"):
            buf.fill(1)
snap = instrument.snapshot()
print(json.dumps({s.name: dict(s.verdict) for s in snap}))
print(json.dumps({a["path"][-1]: a["memory_next"] for a in advise(snap, top=3)}))
""")
    assert r.returncode == 0, r.stderr
    verdicts, advice = (json.loads(line) for line in r.stdout.splitlines()[-2:])
    m = verdicts["fresh"]["memory"]
    assert m["own_peak_mib"] == pytest.approx(64, rel=0.15) and abs(m["net_mib"]) < 0.15 * 64
    assert "touches fresh memory: " in verdicts["fresh"]["reason"]
    assert "memory" not in verdicts["reused"] and "memory" not in verdicts["request"]   # the parent's is its child's
    assert "reuse buffers" in advice["fresh"] and advice.get("reused") is None


class _Allocator:
    """A gauge of the shape CUDA's has: allocated and reserved bytes with their peaks, one reset for both."""
    def __init__(self):
        self.cur = self.peak = self.res = self.res_peak = 0

    def alloc(self, n):
        self.cur += n
        self.res = max(self.res, self.cur)
        self.peak, self.res_peak = max(self.peak, self.cur), max(self.res_peak, self.res)

    def free(self, n):
        self.cur -= n

    def reset(self):
        self.peak, self.res_peak = self.cur, self.res


def test_two_sources_sharing_one_reset_keep_both_peaks():
    """CUDA's allocated and reserved bytes are reset together (reset_peak_memory_stats): the second source has no
    reset of its own, and both marks are folded into the open calls before the first one's reset."""
    g = _Allocator()
    _native.configure(memory=[("alloc", lambda: (g.cur, g.peak), g.reset), ("reserved", lambda: (g.res, g.res_peak),
                                                                            None)])
    try:
        with instrument.stage("outer"):
            g.alloc(1000)
            g.free(1000)
            with instrument.stage("inner"):
                g.alloc(300)
                g.free(300)
        snap = instrument.snapshot()
    finally:
        _native.configure(memory=[])
    assert snap["outer"].memory_of("alloc")["peak_mean"] == 1000
    assert snap["outer/inner"].memory_of("alloc")["peak_mean"] == 300
    assert snap["outer"].memory_of("reserved")["peak_mean"] == 1000   # reserved stays at its high-water
    assert snap["outer/inner"].memory_of("reserved")["peak_mean"] == 0


def test_rss_the_tail_view_names_the_memory_its_slow_calls_took():
    """One call in 50 allocates 96 MiB: the kept slow calls' breakdown holds that peak for the stage that took it,
    the typical call's none, and the tail's sentence says it; the parent's peak is its child's, not its own."""
    r = run_python("""
import json, numpy as np, instrument
from instrument.analysis.tail import tail
instrument.configure(memory="host", overhead_budget=None)
for i in range(300):
    with instrument.stage("request"):
        with instrument.stage("decode"):
            if i % 50 == 7:
                a = np.ones(96 << 20, dtype=np.uint8); del a
            else:
                sum(range(2000))
s = instrument.snapshot()
v = tail(s)[0]
rows = {"/".join(e.path): [e.slow_mem, e.typical_mem, v.own_mem_excess(e)] for e in v.excess}
print(json.dumps({"rows": rows, "sentence": v.sentence(s)}))
""")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    slow, typical, own = out["rows"]["request/decode"]
    assert slow == pytest.approx(96 * MiB, rel=0.15) and typical < MiB and own == pytest.approx(slow - typical)
    assert out["rows"]["request"][2] < MiB
    assert "its memory peak per call is " in out["sentence"]


def test_a_torch_without_the_allocator_s_statistics_leaves_cuda_unread_and_says_why():
    """A torch whose CUDA says it is initialised but whose allocator statistics cannot be read: the import and the
    stages go on, memory of the host is read, and meta says why CUDA's is not."""
    r = run_python("""
import sys, types, json
torch = types.ModuleType("torch")
torch.cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 1)
sys.modules["torch"] = torch
import instrument
with instrument.stage("s"):
    pass
snap = instrument.snapshot()
print(json.dumps([snap["s"].memory_sources, snap.meta["memory"]["cuda"]]))
""")
    assert r.returncode == 0, r.stderr
    sources, why = json.loads(r.stdout.splitlines()[-1])
    assert sources == ["host"] and why.startswith("not read: AttributeError")


def test_a_source_s_python_code_may_enter_stages_deep_in_a_stack():
    """A source whose read enters a stage itself, read by calls nested deeper than the stack's first frames (the
    frames move when the stack grows): every call is recorded, and the source's own stages are not measured."""
    def get():
        with instrument.stage("inside_the_read"):
            pass
        return (5, 5)
    _native.configure(memory=[("reentrant", get, None)])
    try:
        def nest(d):
            with instrument.stage(f"d{d}"):
                if d < 12:
                    nest(d + 1)
        for _ in range(3):
            nest(0)
        snap = instrument.snapshot()
    finally:
        _native.configure(memory=[])
    deep = snap["/".join(f"d{d}" for d in range(13))]
    assert deep.calls == 3 and deep.memory_of("reentrant")["peak_mean"] == 0


def test_a_source_that_closes_the_call_it_reads_for_leaves_the_stack_whole():
    """A source whose read exits the very stage it reads for: at that call's exit, the call is recorded once and its
    parent stays open, closed by its own exit; at its enter, the call is recorded with its wall from its enter (at
    most the with block's, timed around it here), and the with block's own exit is then unmatched (counted).  In a
    child process: the unmatched exit's warning is given once a process."""
    r = run_python("""
import json, time, instrument
from instrument import _native
inner = instrument.stage("inner")
state = {"close": False}
def get():
    if state["close"]:
        state["close"] = False
        inner.__exit__(None, None, None)
    return (5, 5)
_native.configure(memory=[("closer", get, None)])
with instrument.stage("outer"):
    with inner:
        state["close"] = True   # read at inner's exit
    path_after_exit = _native.current_path()
time.sleep(0.01)   # an earlier call's start would show as 10 ms more
with instrument.stage("outer2"):
    state["close"] = True       # read at inner's enter
    unmatched = _native.collect()["unmatched_exits"]
    t0 = time.perf_counter_ns()
    with inner:
        pass
    block = time.perf_counter_ns() - t0
    unmatched = _native.collect()["unmatched_exits"] - unmatched
    path_after_enter = _native.current_path()
snap = instrument.snapshot()
print(json.dumps({"paths": [list(path_after_exit), list(path_after_enter)], "unmatched": unmatched, "block": block,
                  "calls": {"/".join(s.path): s.calls for s in snap}, "wall": snap["outer2/inner"].wall_total}))
""")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["paths"] == [["outer"], ["outer2"]] and out["unmatched"] == 1, out
    calls = out["calls"]
    assert calls["outer"] == calls["outer/inner"] == 1 and calls["outer2"] == calls["outer2/inner"] == 1, calls
    assert 0 < out["wall"] <= out["block"], out


def test_a_source_added_inside_an_open_call_gives_that_call_no_figure_of_it():
    instrument.configure(memory="host")
    with instrument.stage("outer"):
        instrument.configure(memory="host,python")
        x = list(range(100_000))
    f = instrument.snapshot()["outer"]
    assert f.memory_of("python") is None and f.memory_of("host")["calls"] == 1
    del x


def test_ctrl_c_during_a_source_s_read_reaches_the_program():
    # Python's own Ctrl-C handler, as a program started from a terminal has it: one started in the background by a
    # shell inherits SIGINT ignored, and a Ctrl-C handed back to it is then ignored too, as its own would be
    r = run_python("""
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import instrument
from instrument import _native
calls = []
def get():
    calls.append(1)
    if len(calls) == 2:
        raise KeyboardInterrupt
    return (0, 0)
_native.configure(memory=[("g", get, None)])
try:
    for i in range(1000):
        with instrument.stage("s"):
            pass
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted at", i, [s["active"] for s in _native.memory_status() if s["name"] == "g"])
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("interrupted at ") and r.stdout.strip().endswith("[True]"), r.stdout


def test_rss_without_the_host_source_the_process_peak_is_left_alone():
    """memory=python never resets the kernel's high-water mark: a program's own VmHWM still tells its peak."""
    r = run_python("""
import numpy as np
def hwm():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024
a = np.ones(256 << 20, dtype=np.uint8); del a
before = hwm()
import instrument
for _ in range(20):
    with instrument.stage("s"):
        pass
print(before, hwm())
""", env={"INSTRUMENT_MEMORY": "python"})
    assert r.returncode == 0, r.stderr
    before, after = map(int, r.stdout.split())
    assert before > 256 << 20 and after >= before
