"""GIL wait per stage: the split's `gil` part, checked against what each thread measures inside its own calls
(wall less its CPU clock less the kernel's run-queue time: a pure-Python thread off the CPU by its own doing is
waiting for the GIL), and against waits that are not the GIL's (a pipe, a lock, a sleep).  The sampler is the C
core's; on a loaded 2-core machine."""
import os
import threading
import time

import pytest

import instrument
from conftest import run_python
from thread_clocks import edge, schedstat, thread_cpu_ns
from instrument import _native
from instrument.live import doctor
from instrument.snapshot import SPLIT, Snapshot

pytestmark = pytest.mark.native_only


def _python_work(n=60_000):
    x = 0
    for i in range(n):
        x += i
    return x


def _off(work):
    """Run work() and return what this thread was off the CPU by its own doing meanwhile: wall less CPU less run
    queue, read around it by the test (none of its reads lets go of the GIL)."""
    schedstat()
    w0, c0, r0 = edge()
    work()
    w1, c1, r1 = edge()
    return w1 - w0 - (c1 - c0) - (r1 - r0)


def _adds_up(s):
    for k in ("total", "self"):
        parts = sum(v[k] for p, v in s.wall_split.items())
        assert parts == pytest.approx(s.wall_total if k == "total" else s.wall_self, rel=0.02, abs=1000)


def _threads(target, n):
    ts = [threading.Thread(target=target) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def _call(st, work):
    def call():
        with st:
            work()
    return call


def test_four_python_threads_on_two_cores_wait_for_the_gil(backend):
    """Four threads of pure-Python work, each in one call of a stage: the stage's GIL wait is what the threads
    measured off the CPU around their own calls (within 15 %); it is taken out of blocked, the parts add up, and
    the verdict is gil-bound.  (One call a thread: a thread that waits for the GIL drops it again soon after it
    takes it, wherever its code then is, so Python-level reads around many short calls would hold GIL waits of
    their own.)"""
    around, start = [], threading.Barrier(4)

    def worker():
        st = instrument.stage("py")
        start.wait()   # all four at once: none runs its calls alone before the others have started
        around.append(_off(_call(st, lambda: [_python_work() for _ in range(50)])))
    _threads(worker, 4)
    s = instrument.snapshot()["py"]
    gil, off = s.split_part("gil"), sum(around)
    assert off > 0.3 * s.wall_total, "four Python threads should wait for the GIL most of the time"
    assert abs(gil - off) <= 0.15 * off, (gil, off, s.wall_split)
    assert s.split_part("blocked") <= 0.15 * off
    lo, hi = s.wall_split["gil"]["ci99"]
    assert lo <= gil <= hi and s.wall_split["gil"]["samples"]["gil_total"] > 0
    _adds_up(s)
    assert s.verdict["verdict"] == "gil-bound", s.verdict
    assert s.verdict["evidence"]["split"]["gil"] >= 1 / 3


def test_a_pipe_read_alone_is_not_gil_wait(backend):
    """A pipe read with no other Python thread running (the writer is a process): blocked, GIL wait <= 5 %."""
    import subprocess
    import sys
    writer = subprocess.Popen([sys.executable, "-c", "import sys, time\nfor _ in range(20):\n    time.sleep(0.01)\n"
                               "    sys.stdout.write('x'); sys.stdout.flush()"], stdout=subprocess.PIPE)
    try:
        for _ in range(20):
            with instrument.stage("pipe"):
                os.read(writer.stdout.fileno(), 1)
    finally:
        writer.wait()
    s = instrument.snapshot()["pipe"]
    assert s.split_part("gil") <= 0.05 * s.wall_total, s.wall_split
    assert s.split_part("blocked") >= 0.5 * s.wall_total
    assert s.wall_split["gil"]["samples"]["blocked_total"] > 0   # the sampler saw the thread blocked, not on the GIL
    _adds_up(s)


def test_a_lock_held_by_a_sleeping_thread_is_blocked_not_gil_wait(backend):
    """A threading.Lock held by a thread that sleeps: the waiting stage's GIL wait <= 10 %, the rest blocked."""
    lock, held = threading.Lock(), threading.Event()

    def holder():
        with lock:
            held.set()
            time.sleep(0.3)
    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    with instrument.stage("lock"):
        with lock:
            pass
    t.join()
    s = instrument.snapshot()["lock"]
    assert s.split_part("gil") <= 0.10 * s.wall_total, s.wall_split
    assert s.split_part("blocked") >= 0.5 * s.wall_total
    _adds_up(s)


def _off_cpu(work):
    """Run work() and return the wall time this thread was off the CPU meanwhile (wall less CPU: the CPU window
    inside the wall one), whatever kept it off (the GIL, the run queue, I/O)."""
    w, c = time.perf_counter_ns(), time.thread_time_ns()
    work()
    c = time.thread_time_ns() - c
    return time.perf_counter_ns() - w - c


def test_gil_wait_only_where_the_threads_own_timing_shows_it(backend):
    """numpy's matmul releases the GIL; beside a pure-Python thread it waits to take it back after products.  Each
    stage's GIL wait is no more than the time its thread measured itself off the CPU around its calls.  (The run
    queue's share is not taken out here: a Python-level read of it lets other threads take the GIL in between.)"""
    np = pytest.importorskip("numpy")
    a = np.random.default_rng(0).random((200, 200))
    stop, py_off, mm_off = threading.Event(), [], []
    py, mm = instrument.stage("py"), instrument.stage("mm")

    def python_thread():
        while not stop.is_set():
            py_off.append(_off_cpu(_call(py, lambda: _python_work(20_000))))
    t = threading.Thread(target=python_thread)
    t.start()
    try:
        for _ in range(40):
            mm_off.append(_off_cpu(_call(mm, lambda: a @ a)))
    finally:
        stop.set()
        t.join()
    snap = instrument.snapshot()
    mm, py = snap["mm"], snap["py"]
    for s, off in ((mm, sum(mm_off)), (py, sum(py_off))):
        assert s.split_part("gil") <= off, (s.path, s.wall_split, off)
    _adds_up(mm)
    _adds_up(py)


def test_off_there_is_no_gil_part(backend):
    """gil_wait off: no gil part (none is guessed), the sampler reads nothing; doctor says it is off."""
    instrument.configure(gil_wait=False)
    time.sleep(0.01)   # a round of reads under way when it was turned off ends
    before, tid = _native.gil_status()["reads"], _native.gil_status()["tid"]
    assert tid, "the sampler started with the default configuration"
    cpu0, wall0 = thread_cpu_ns(tid), time.perf_counter_ns()

    def worker():
        for _ in range(5):
            with instrument.stage("py"):
                _python_work()
    _threads(worker, 3)
    cpu, wall = thread_cpu_ns(tid) - cpu0, time.perf_counter_ns() - wall0
    s = instrument.snapshot()["py"]
    assert s.split_part("gil") is None and "gil" not in s.wall_split and s.gil_samples is None
    assert _native.gil_status()["reads"] == before
    assert cpu <= 0.005 * wall + 500_000, (cpu, wall)   # off, the sampler only looks now and then: it never spins
    assert "GIL wait          not measured" in doctor.format_text(doctor.collect())


def test_the_pure_python_recorder_has_no_gil_part(fallback):
    def worker():
        for _ in range(3):
            with instrument.stage("py"):
                _python_work()
    _threads(worker, 2)
    s = instrument.snapshot()
    assert s["py"].split_part("gil") is None and s.meta["gil_wait"]["mechanism"] == "none"
    assert "GIL wait" in s.meta["backend"]["missing"]


def test_the_gil_part_survives_save_load_merge_and_windows(backend, tmp_path):
    """Saved and loaded, merged with itself (the waits and samples sum) and as a window (what a later snapshot
    added): the gil part and its interval come back."""
    def worker():
        for _ in range(8):
            with instrument.stage("py"):
                _python_work()
    _threads(worker, 3)
    early = instrument.snapshot()
    _threads(worker, 3)
    later = instrument.snapshot()
    path = tmp_path / "s.json"
    later.save(path)
    back = Snapshot.load(path)
    s, b = later["py"], back["py"]
    assert s.gil_total is not None and (b.gil_total, b.gil_self) == (s.gil_total, s.gil_self)
    assert b.gil_samples == pytest.approx(s.gil_samples, rel=1e-3)
    assert b.wall_split["gil"]["ci99"] == pytest.approx(s.wall_split["gil"]["ci99"], rel=1e-6)
    both = Snapshot.merge(later, later)["py"]
    assert both.gil_total == 2 * s.gil_total
    assert both.gil_samples["gil_total"] == pytest.approx(2 * s.gil_samples["gil_total"])
    window = later.since(early)["py"]
    assert window.gil_total == s.gil_total - early["py"].gil_total
    assert set(SPLIT) >= set(s.wall_split)


def test_a_forked_child_samples_its_own_threads():
    """After a fork the child's threads are sampled by a sampler of its own (the parent's does not exist there)."""
    r = run_python("""
import os, threading, json
import instrument
from instrument import _native
def work():
    for _ in range(20):
        with instrument.stage("py"):
            x = 0
            for i in range(60000): x += i
with instrument.stage("warm"):
    pass
pid = os.fork()
if pid == 0:
    ts = [threading.Thread(target=work) for _ in range(3)]
    [t.start() for t in ts]; [t.join() for t in ts]
    s = instrument.snapshot()["py"]
    print(json.dumps({"gil": s.split_part("gil"), "off": s.split_part("gil") + s.split_part("blocked"),
                      "reads": _native.gil_status()["reads"]}))
    os._exit(0)
os.waitpid(pid, 0)
""")
    assert r.returncode == 0, r.stderr
    import json
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["reads"] > 0 and got["off"] > 0 and got["gil"] >= 0.5 * got["off"], got


def test_doctor_names_the_mechanism_its_rate_and_cost(backend):
    g = _native.gil_status()
    assert g["enabled"] and g["mechanism"].startswith("futex sampling") and g["cpu_share_max"] > 0
    text = doctor.format_text(doctor.collect())
    assert "GIL wait          futex sampling of /proc/self/task/<tid>/syscall; every" in text
    assert "of one core so far (at most 0.5 %)" in text
