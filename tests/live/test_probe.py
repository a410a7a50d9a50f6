"""The machine probe: the C core's hook after an outermost exit once due marks the stages as running; the reference
loop is timed on a thread of the probe's own, never on the stages' threads; its timings in meta.machine.probe.
Checked against the hook's own calls (when, on which thread, with which stage open), against the same loop timed
by the test in the same window, against the probe thread's own CPU clock, against the share of the time it may
take, and against the wall the test measures around each `with` beside a CPU hog on the same core."""
import json
import os
import threading
import time
import warnings

import pytest

import instrument
from instrument.live import probe

try:
    from instrument import _native
except ImportError:
    _native = None


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


def test_one_timing_returns_its_cpu_time_and_keeps_it():
    outers = []
    for _ in range(20):
        c0 = time.thread_time_ns()
        cpu = probe.probe()
        outers.append(time.thread_time_ns() - c0)
        assert 0 < cpu <= outers[-1]   # inside the test's window on the same clock
    s = probe.summary()
    assert s["timings"] >= 20 and s["iterations"] == probe.ITERATIONS
    assert s["median"] * probe.ITERATIONS <= max(outers)
    probe.reset()


def test_set_probe_hook_refuses_what_is_not_callable(backend):
    with pytest.raises(TypeError, match="set_probe_hook needs a callable or None, not int"):
        backend.set_probe_hook(42)


def probe_thread_cpu_ns():
    """The probe thread's CPU clock, read from this thread (0 before it starts)."""
    ident = probe.ident()
    return time.clock_gettime_ns(time.pthread_getcpuclockid(ident)) if ident else 0


def test_the_snapshot_holds_the_probe_timings_of_the_window(backend):
    instrument.configure(machine_probe=True)
    instrument.reset()
    thread_cpu0 = probe_thread_cpu_ns()
    mine = []
    start = time.perf_counter()
    # half a second, and on a slow machine until the probe holds MIN_TIMINGS timings
    while time.perf_counter() - start < 0.5 or probe.summary() is None and time.perf_counter() - start < 20:
        with instrument.stage("request"):
            sum(range(5000))
        c0 = time.thread_time_ns()   # the same loop, timed by the test beside the probe's timings
        probe.loop(probe.ITERATIONS)
        mine.append((time.thread_time_ns() - c0) / probe.ITERATIONS)
    snap = instrument.snapshot()
    thread_cpu = probe_thread_cpu_ns() - thread_cpu0
    p = snap.meta["machine"]["probe"]
    assert p["kept"] == p["timings"] >= probe.MIN_TIMINGS and p["iterations"] == probe.ITERATIONS and p["se_log"] > 0
    mine.sort()
    # the same loop in the same window on another thread: the probe's mean lies within the test's quartiles, less
    # 10 % or plus 25 % (the probe's loop runs after a sleep: about 11 % slower here than the test's, run over and
    # over straight after a stage)
    q1, q3 = mine[len(mine) // 4], mine[3 * len(mine) // 4]
    assert 0.9 * q1 <= p["ns"] <= 1.25 * q3, (p, q1, q3)
    # its own cost, on the probe thread's own CPU clock: each turn sleeps its CPU time over SHARE before the next,
    # so all but the last hold SHARE of the window at most
    assert thread_cpu - probe.SHARE * snap.meta["duration_ns"] <= thread_cpu / 2, (thread_cpu, snap.meta["duration_ns"])
    # the cost it states is that thread's CPU by whole turns (one turn at each end of the window may differ), and
    # holds at least its timings
    assert thread_cpu / 2 <= p["cpu_ns"] <= 3 * thread_cpu / 2, (p, thread_cpu)
    assert p["cpu_ns"] >= p["timings"] * probe.ITERATIONS * p["median"] / 2, p
    if "overhead" in snap.meta:   # meta.overhead states it beside the reads' cost
        assert snap.meta["overhead"]["probe_cpu_ns"] >= p["cpu_ns"]
    instrument.reset()
    assert instrument.snapshot().meta["machine"]["probe"] is None   # a new window starts without timings


def test_the_loop_is_timed_on_the_probe_thread_only(backend, monkeypatch):
    instrument.configure(machine_probe=True)
    where = []
    timed = probe.probe

    def spy():
        where.append((threading.get_ident(), backend.current_path()))
        return timed()

    monkeypatch.setattr(probe, "probe", spy)
    start = time.perf_counter()
    while time.perf_counter() - start < 0.3 or len(where) < 3 and time.perf_counter() - start < 20:
        with instrument.stage("request"):
            with instrument.stage("inner"):
                sum(range(5000))
    assert len(where) >= 3
    assert {ident for ident, _ in where} == {probe.ident()} and probe.ident() != threading.get_ident()
    assert all(path == () for _, path in where)   # the probe thread never opens a stage


def test_an_idle_program_parks_the_probe_thread(backend):
    instrument.configure(machine_probe=True)
    timed = busy_until_timed()["timings"]
    # a second with no stage: one timing at most (a mark the hook set before the stages stopped), where a probe
    # that did not park would take one every wait (its turn's CPU over SHARE: 0.02-0.1 s here)
    time.sleep(1.0)
    idle = instrument.snapshot().meta["machine"]["probe"]["timings"]
    assert idle <= timed + 1, (timed, idle)
    start = time.perf_counter()   # stages again: the hook wakes it
    while instrument.snapshot().meta["machine"]["probe"]["timings"] == idle and time.perf_counter() - start < 20:
        busy_until_timed(least=0.05)
    assert instrument.snapshot().meta["machine"]["probe"]["timings"] > idle


def test_beside_a_hog_the_stage_keeps_the_wall_around_its_with(backend, shared_core):
    """Timing only, the probe on, a CPU hog on the same core: the probe takes nothing from the caller's `with`
    outside the stage (on the stage's thread its CPU-clock reads had the thread preempted there: 0.92-0.97)."""
    if backend is not _native:   # the pure twin's own enter and exit are tens of µs of Python outside the stage
        pytest.skip("the native backend's wall")
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


def busy_until_timed(least=0.2, most=20.0):
    """Stages for at least `least` seconds and until the probe holds MIN_TIMINGS timings (it sleeps its turn's CPU
    over SHARE between timings: fewer timings fit in a fixed window on a slow machine)."""
    start = time.perf_counter()
    while True:
        for _ in range(20):
            with instrument.stage("request"):
                sum(range(5000))
        now = time.perf_counter() - start
        if now >= most or (now >= least and instrument.snapshot().meta["machine"]["probe"] is not None):
            return instrument.snapshot().meta["machine"]["probe"]


def test_a_forked_child_times_its_own_machine(backend):
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
