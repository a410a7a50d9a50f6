"""The machine probe: after an outermost stage exit, once it is due, the reference loop timed on that thread, never
inside a stage, on the thread CPU read of the hot path; its timings in meta.machine.probe.  Checked against the
hook's own calls (when, on which thread, with which stage open), against the same loop timed by the test in the
same window on the same clock, against the share of the time it may take, and against the wall the test measures
around each `with` beside a CPU hog on the same core."""
import json
import os
import threading
import time
import warnings

import pytest

import instrument
from instrument.live import probe

pytestmark = pytest.mark.native_only   # what only the C core records (conftest.py)


def test_the_hook_runs_after_outermost_exits_once_due(backend):
    wait = 3_000_000
    calls, ends, exits = [], [], []

    def hook():
        calls.append((time.perf_counter_ns(), backend.current_path(), threading.get_ident()))
        ends.append(time.perf_counter_ns())
        return wait

    backend.set_probe_hook(hook)
    try:
        end = time.perf_counter() + 0.2
        while time.perf_counter() < end:
            with instrument.stage("request"):
                with instrument.stage("inner"):
                    sum(range(2000))
            exits.append(time.perf_counter_ns())
    finally:
        backend.set_probe_hook(None)
    assert len(calls) >= 2
    assert all(path == () and ident == threading.get_ident() for _, path, ident in calls)   # outside every stage
    starts = [t for t, _, _ in calls]
    assert all(b - a >= wait for a, b in zip(ends, starts[1:]))   # never before it is due, counted from its end
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # and at the first outermost exit once due: a gap exceeds the wait by at most the longest stretch between two
    # outermost exits the test saw (twice: the test's stamps follow the exits they mark)
    stretch = max(b - a for a, b in zip(exits, exits[1:]))
    assert max(gaps) <= wait + 2 * stretch, (max(gaps), wait, stretch)


def test_inner_exits_do_not_run_it(backend):
    calls = []
    backend.set_probe_hook(lambda: calls.append(1) or 1)
    try:
        with instrument.stage("request"):
            for _ in range(50):
                with instrument.stage("inner"):
                    pass
            assert calls == []
        assert calls == [1]
    finally:
        backend.set_probe_hook(None)


@pytest.mark.parametrize("bad", [lambda: 1 / 0, lambda: "soon"])
def test_a_failing_probe_is_an_internal_failure_and_waits(backend, bad):
    backend.set_probe_hook(bad)
    try:
        with warnings.catch_warnings():   # "internal failure in machine probe", warned once per process
            warnings.simplefilter("ignore")
            with instrument.stage("request"):
                pass
            with instrument.stage("request"):   # a failed probe is due again only after a second
                pass
    finally:
        backend.set_probe_hook(None)
    s = instrument.snapshot()
    assert s["request"].calls == 2 and s.meta["internal_failures"] == 1


def test_the_probe_waits_its_own_cpu_time_over_its_share():
    for _ in range(20):
        c0 = time.thread_time_ns()
        wait = probe.probe()
        outer = time.thread_time_ns() - c0
        # its CPU time is inside the test's window: the wait it asks for is at most that over SHARE
        assert probe.ITERATIONS / probe.SHARE <= wait <= outer / probe.SHARE
    probe.reset()


def test_the_hook_times_on_the_backends_thread_cpu_read(backend):
    """The backend's hook times the loop on the hot path's CPU read (the task-clock, which preempts nothing)."""
    hook = probe.hook(backend)
    with instrument.stage("request"):   # the thread's state, as after the outermost exit that runs the hook
        pass
    for _ in range(20):
        c0 = backend.thread_cpu_ns()
        wait = hook()
        outer = backend.thread_cpu_ns() - c0
        assert probe.ITERATIONS / probe.SHARE <= wait <= outer / probe.SHARE
    probe.reset()


def test_set_probe_hook_refuses_what_is_not_callable(backend):
    with pytest.raises(TypeError, match="set_probe_hook needs a callable or None, not int"):
        backend.set_probe_hook(42)


def test_the_snapshot_holds_the_probe_timings_of_the_window(backend):
    instrument.configure(machine_probe=True)
    instrument.reset()
    mine = []
    start = time.perf_counter()
    # half a second, and on a slow machine until the probe holds MIN_TIMINGS timings
    while time.perf_counter() - start < 0.5 or probe.summary() is None and time.perf_counter() - start < 20:
        before = probe._count
        with instrument.stage("request"):
            sum(range(5000))
        if probe._count != before:
            continue   # the probe timed the loop after this exit: the test's would follow the probe's, warmer
        c0 = backend.thread_cpu_ns()   # the same loop on the same clock after the same exit, beside the probe's
        probe.loop(probe.ITERATIONS)
        mine.append((backend.thread_cpu_ns() - c0) / probe.ITERATIONS)
    snap = instrument.snapshot()
    p = snap.meta["machine"]["probe"]
    assert p["kept"] == p["timings"] >= probe.MIN_TIMINGS and p["iterations"] == probe.ITERATIONS and p["se_log"] > 0
    mine.sort()
    # the same loop on the same thread and clock, right after the same kind of outermost exit, interleaved with the
    # probe's, whatever the load does to both: the probe's median lies within the test's 5th to 95th percentiles,
    # less 10 % or plus 25 % (the probe's loop runs inside the exit, called from the C core: it times 8-12 % slower
    # here than the test's, beside a hog as on a quiet machine)
    lo, hi = mine[len(mine) // 20], mine[-(len(mine) // 20) - 1]
    assert 0.9 * lo <= p["median"] <= 1.25 * hi, (p, lo, hi)
    # its own cost: each timing waits its CPU time over SHARE before the next, so all but the last hold SHARE of
    # the window at most; meta.overhead states it and counts it in the SDK's estimated cost
    assert p["cpu_ns"] - probe.SHARE * snap.meta["duration_ns"] <= p["cpu_ns"] / 2, (p, snap.meta["duration_ns"])
    o = snap.meta["overhead"]
    assert o["probe_cpu_ns"] == p["cpu_ns"]
    assert o["estimated_ns"] == round(o["calls"] * o["per_call_ns"] + o["read_calls"] * o["per_read_ns"] + p["cpu_ns"])
    instrument.reset()
    assert instrument.snapshot().meta["machine"]["probe"] is None   # a new window starts without timings


def test_beside_a_hog_the_stage_keeps_the_wall_around_its_with(backend, shared_core):
    """Timing only, the probe on, a CPU hog on the same core: the probe takes almost nothing from the caller's `with`
    outside the stage (read with CLOCK_THREAD_CPUTIME_ID, its reads had the thread preempted there: 0.92-0.97)."""
    instrument.configure(counters="none", cpu_clock=False, machine_probe=True)
    instrument.reset()
    st = instrument.stage("work")
    around = 0
    start = time.perf_counter()
    while time.perf_counter() - start < 1.5 or probe.summary() is None and time.perf_counter() - start < 30:
        t0 = time.perf_counter_ns()
        with st:
            end = time.perf_counter() + 0.015
            while time.perf_counter() < end:
                pass
        around += time.perf_counter_ns() - t0
    snap = instrument.snapshot()
    assert snap.meta["machine"]["probe"] is not None   # it still yields its figure
    assert snap["work"].wall_total >= 0.98 * around, (snap["work"].wall_total, around)


def test_off_by_the_option(backend):
    instrument.configure(machine_probe=False)
    end = time.perf_counter() + 0.1
    while time.perf_counter() < end:
        with instrument.stage("request"):
            sum(range(5000))
    assert instrument.snapshot().meta["machine"]["probe"] is None


def busy_until_timed(most=20.0):
    """Stages for at least 0.2 s and until the probe holds MIN_TIMINGS timings."""
    start = time.perf_counter()
    while True:
        for _ in range(20):
            with instrument.stage("request"):
                sum(range(5000))
        now = time.perf_counter() - start
        if now >= most or (now >= 0.2 and instrument.snapshot().meta["machine"]["probe"] is not None):
            return instrument.snapshot().meta["machine"]["probe"]


def test_a_forked_child_times_its_own_machine(backend):
    instrument.configure(machine_probe=True)
    mine = busy_until_timed()
    assert mine is not None and mine["timings"] >= probe.MIN_TIMINGS
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: none of the parent's timings, then its own
        try:
            first = instrument.snapshot().meta["machine"]["probe"]
            later = busy_until_timed()
            os.write(w, json.dumps([first, later]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        first, later = json.loads(f.read())
    os.waitpid(pid, 0)
    assert first is None and later is not None and later["timings"] >= probe.MIN_TIMINGS
