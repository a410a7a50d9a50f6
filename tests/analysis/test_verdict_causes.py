"""Verdicts that name the right cause, each against a truth the test measures itself: the thread's own clocks
and rusage around the work, the CPU a helper thread took by its own clock, and the shares the verdict prints."""
import asyncio
import os
import re
import resource
import threading
import time

import numpy as np
import pytest

import instrument
from instrument.analysis import verdict
from conftest import check_verdict_shares

pytestmark = pytest.mark.native_only   # instrument's own cost, helper threads and the run queue: the C core's


def py_work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def run_in(where, fn):
    """Runs fn() on a plain thread, or as an asyncio task (its stages then follow the task)."""
    if where == "thread":
        t = threading.Thread(target=fn)
        t.start()
        t.join()
    else:
        async def task():
            fn()
            await asyncio.sleep(0)
        asyncio.run(task())


def check_shares(snap):
    """Every verdict's printed shares are of the own time and add up to at most 100 % (rounding aside)."""
    for s in snap:
        if s.calls and s.verdict:
            check_verdict_shares(s.verdict)


@pytest.mark.parametrize("where", ["thread", "task"])
def test_a_parent_that_only_enters_children_is_not_judged_by_instruments_own_reads(backend, where):
    instrument.configure(overhead_budget=None, counters=["task-clock"])   # every call read: the most reads

    def body():
        for _ in range(1500):
            with instrument.stage("request"):
                with instrument.stage("a"):
                    py_work(100)
                with instrument.stage("b"):
                    py_work(100)
                with instrument.stage("c"):
                    py_work(100)

    run_in(where, body)
    # the truth, in the same window: what a read stage call costs this thread's CPU, timed from outside
    c0 = time.thread_time_ns()
    for _ in range(1500):
        with instrument.stage("cost"):
            pass
    per_call = (time.thread_time_ns() - c0) / 1500
    snap = instrument.snapshot()
    req = snap["request"]
    assert 0.4 * 4500 * per_call <= req.instrument_self <= 2.5 * 4500 * per_call, (req.instrument_self, per_call)
    v = req.verdict
    assert v["verdict"] != "kernel-bound", v
    if v["verdict"] not in ("cpu-starved", "waiting"):   # a loaded machine may hold it in the run queue
        assert v["verdict"] == "instrument" and "instrument's reads" in v["reason"], v
    assert snap["request", "a"].instrument_self == 0          # a leaf holds no child's boundaries
    assert req.instrument_total >= req.instrument_self   # (the held split may scale its own part to its covered time)
    check_shares(snap)


def test_helper_cpu_is_never_below_zero_and_cited_only_beyond_its_interval(backend):
    instrument.configure(counters=["task-clock"])
    go, done, leave = threading.Event(), threading.Event(), threading.Event()
    spent = []

    def helper():   # a thread that runs no stage: it computes only while `par` is open (and ends after it: an
        go.wait()   # ended thread's clock cannot be read, and what it ran since the last read is not seen)
        c0 = time.thread_time_ns()
        py_work(400_000)
        spent.append(time.thread_time_ns() - c0)
        done.set()
        leave.wait()

    t = threading.Thread(target=helper)
    t.start()
    others = other_threads_cpu(t.native_id)
    for _ in range(300):   # single-threaded work first: no helper thread runs
        with instrument.stage("req"):
            with instrument.stage("work"):
                py_work(300)
    with instrument.stage("par"):
        go.set()
        while not done.is_set():
            time.sleep(0.001)
    others = other_threads_cpu(t.native_id) - others   # what threads of earlier tests (pools) computed meanwhile
    leave.set()
    t.join()
    snap = instrument.snapshot()
    for path in (("req",), ("req", "work")):
        assert "helper threads" not in snap[path].verdict["reason"], snap[path].verdict
    par = snap["par"]
    # the helper's own clock is the truth: all of its CPU ran while `par` was open, and no other thread computed
    assert 0.9 * spent[0] <= par.helpers["total"] <= spent[0] * 1.1 + others + 5_000_000, (par.helpers, spent, others)
    assert par.helpers_beyond_noise() == par.helpers["self"] > 0
    check_shares(snap)


def other_threads_cpu(*also):
    """CPU time of the process's threads other than this one and `also`, from the kernel (schedstat, ns)."""
    skip = {str(threading.get_native_id())} | {str(t) for t in also}
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if tid not in skip:
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:   # the thread ended
                pass
    return total


def own_truth(fn):
    """Runs fn() and returns what the thread measured itself around it: wall, CPU, run-queue delay (read with one
    system call at the window's edges: the GIL a read gives up is taken back after its value is read)."""
    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    try:
        def sched():
            return int(os.pread(fd, 200, 0).split()[1])
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        q0 = sched()
        fn()
        w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        return w1 - w0, c1 - c0, sched() - q0
    finally:
        os.close(fd)


def test_python_threads_queueing_for_the_gil_are_judged_gil_bound(backend):
    # helper threads' CPU left out: a thread pool of an earlier test (OpenMP spins after its work) computing beside
    # the four would rightly count as parallel compute, and the rule judged here is about the stages' own threads
    instrument.configure(counters=["task-clock", "context-switches"], helper_cpu=False)
    truth = []
    start = threading.Barrier(4)

    def call():
        with instrument.stage("py"):
            py_work(300_000)

    def worker():
        start.wait()   # all four at once: each waits for the GIL while the others run Python
        for _ in range(6):
            truth.append(own_truth(call))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = instrument.snapshot()
    v = snap["py"].verdict
    wall, cpu, rq = (sum(x[k] for x in truth) for k in range(3))
    blocked = wall - cpu - rq   # off the CPU and not ready: with four Python threads on the CPUs, the GIL
    assert blocked > 0
    if blocked >= 0.4 * wall and blocked >= rq and cpu < 0.5 * wall:
        assert v["verdict"] == "gil-bound", (v, wall, cpu, rq)
        assert "GIL" in v["reason"] and v["evidence"]["stage_threads"] >= 1.5
        from instrument.analysis.advice import NEXT_STEP
        assert "free-threaded" in NEXT_STEP["gil-bound"] and "processes" in NEXT_STEP["gil-bound"]
    else:   # a loaded machine: the threads mostly waited for a CPU, or ran
        assert v["verdict"] in ("cpu-starved", "gil-bound", "mixed", "compute-bound", "waiting"), v
    check_shares(snap)


def test_a_pipe_read_with_no_other_python_thread_is_waiting_not_gil_bound(backend):
    instrument.configure(counters=["task-clock", "context-switches"])
    r, w = os.pipe()
    for _ in range(3):
        t = threading.Timer(0.05, lambda: os.write(w, b"x"))
        t.start()
        with instrument.stage("read"):
            os.read(r, 1)
        t.join()
    os.close(r), os.close(w)
    snap = instrument.snapshot()
    assert snap["read"].verdict["verdict"] == "waiting", snap["read"].verdict
    check_shares(snap)


@pytest.mark.parametrize("where", ["thread", "task"])
def test_a_stage_mostly_in_the_kernel_is_kernel_bound_not_compute(backend, where):
    instrument.configure(counters=["task-clock", "page-faults"])
    measured = []

    def loop():
        for _ in range(40):
            with instrument.stage("alloc"):
                a = np.ones((3000, 3000))   # 72 MB of fresh pages each call: page faults, zeroing
                del a

    def body():
        u0 = resource.getrusage(resource.RUSAGE_THREAD)
        wall, _, rq = own_truth(loop)
        u1 = resource.getrusage(resource.RUSAGE_THREAD)
        sys_, user = u1.ru_stime - u0.ru_stime, u1.ru_utime - u0.ru_utime
        measured.append((sys_ / (sys_ + user), rq / wall))

    run_in(where, body)
    snap = instrument.snapshot()
    v = snap["alloc"].verdict
    assert snap["alloc"].cpu_calls and snap["alloc"].cpu_self / snap["alloc"].cpu_calls >= verdict.SYS_RESOLVED_NS
    sys_share, queued = measured[0]   # the thread's own rusage over the whole loop (many ticks), its run queue
    if sys_share >= 0.6 and queued < 0.2:
        assert v["verdict"] == "kernel-bound", (v, measured)
    assert v["verdict"] != "compute-bound" or v["evidence"].get("sys_share", 0) < 0.5, v
    check_shares(snap)


def test_short_calls_are_not_judged_by_a_system_share_the_kernel_cannot_resolve(backend):
    instrument.configure(overhead_budget=None, counters=["task-clock"])
    for _ in range(3000):
        with instrument.stage("tiny"):
            py_work(50)   # a few µs of pure Python: any system share here is the thread's running ratio
    v = instrument.snapshot()["tiny"].verdict
    assert v["verdict"] != "kernel-bound", v
    assert any("system time" in x for x in v["limited_by"]), v


def test_every_verdict_of_a_mixed_program_prints_shares_that_add_up(backend):
    instrument.configure(counters=["task-clock", "context-switches", "page-faults"])
    lock = threading.Lock()

    async def handler():
        with instrument.stage("handler"):
            await asyncio.sleep(0.002)
            py_work(20_000)

    def mixed():
        with instrument.stage("sleep"):
            time.sleep(0.01)
        with instrument.stage("spin"):
            py_work(50_000)
        with instrument.stage("lock"):
            with lock:
                py_work(1000)
        with instrument.stage("np"):
            np.ones((500, 500)).sum()

    for _ in range(5):
        mixed()
    t = threading.Thread(target=lambda: [mixed() for _ in range(5)])
    t.start()
    async def main():
        await asyncio.gather(*(handler() for _ in range(10)))

    asyncio.run(main())
    t.join()
    snap = instrument.snapshot()
    assert {s.verdict["verdict"] for s in snap if s.calls} <= set(verdict_names())
    check_shares(snap)


def verdict_names():
    doc = verdict.__doc__
    return {m.group(1) for m in re.finditer(r"^- ([a-z?-]+)", doc, re.M)} | {"memory-bound?"}


def test_a_merge_of_windows_is_judged_per_second_each_window_recorded(backend):
    """Process evidence of a merge is over the time its windows recorded, not over one window's: a single thread's
    windows merged stay one thread inside stages at once."""
    instrument.configure(counters=["task-clock", "context-switches"])
    parts = []
    for _ in range(4):
        instrument.reset()
        for _ in range(5):
            with instrument.stage("req"):
                time.sleep(0.01)
        parts.append(instrument.snapshot())
    merged = parts[0].merge(*parts[1:])
    one = verdict.process_evidence(parts[0])
    ev = verdict.process_evidence(merged)
    assert 0 < ev["stage_threads"] <= 1.0 and 0 < one["stage_threads"] <= 1.0
    recorded = sum(p.meta["duration_ns"] for p in parts)   # each window's own clock
    roots = merged["req"].wall_total
    assert ev["stage_threads"] == pytest.approx(roots / recorded, rel=0.05)
    assert verdict.with_verdicts(merged)["req"].verdict["verdict"] == "waiting"


def test_a_window_is_judged_per_second_of_the_window(backend):
    """Process evidence of since() is over the window's own time: stages filling a window are ~1 thread at once
    there, however long the recording before it."""
    instrument.configure(counters=["task-clock", "context-switches"])
    with instrument.stage("before"):
        time.sleep(0.3)
    time.sleep(0.2)   # recorded time with no stage open
    earlier = instrument.snapshot()
    w0 = time.perf_counter_ns()
    for _ in range(10):
        with instrument.stage("req"):
            time.sleep(0.01)
    later = instrument.snapshot()
    window_wall = time.perf_counter_ns() - w0   # the test's own clock around the window's stages
    ev = verdict.process_evidence(later.since(earlier))
    inside = later["req"].wall_total
    assert inside / (window_wall * 1.5) <= ev["stage_threads"] <= 1.0, (ev, inside, window_wall)
