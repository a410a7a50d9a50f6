"""Who held the event loop while a stage's calls were ready to run: a task step's time goes to the stages open while
it ran (split at the stage boundaries inside it), `loop_blockers` is the time each held the loop (each moment once)
and `loop_blockers_waited` the ready time it cost the waiting calls (summed over them).  Checked against the work's
own clocks (perf_counter_ns around each spin, the thread's CPU clock) and the run's wall time."""
import asyncio
import json
import random
import threading
import time

import pytest

import instrument
from instrument.snapshot import Snapshot

pytestmark = pytest.mark.native_only   # task attribution is the C core's (the fallback records no blockers)


def spin(ns):
    """Burn `ns` of this thread's CPU: (perf_counter_ns at the start, at the end, the CPU time it took)."""
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    while time.thread_time_ns() - c0 < ns:
        pass
    return t0, time.perf_counter_ns(), time.thread_time_ns() - c0


def assert_figures_hold(s, wall):
    """What holds whatever the load: the blockers' held times are disjoint stretches of one run (their sum is at most
    its wall time), each blocker cost the calls at least the time it held the loop, and what it cost them is a part of
    the stage's ready time."""
    assert set(s.loop_blockers) == set(s.loop_blockers_waited), (s.loop_blockers, s.loop_blockers_waited)
    assert sum(s.loop_blockers.values()) <= wall, (s.loop_blockers, wall)
    for p, held in s.loop_blockers.items():
        assert held <= s.loop_blockers_waited[p], (p, s.loop_blockers, s.loop_blockers_waited)
    assert sum(s.loop_blockers_waited.values()) <= s.split_part("loop_ready"), (s.loop_blockers_waited, s.wall_split)


def test_a_step_that_leaves_wait_and_spins_in_cpu_is_held_by_cpu(backend):
    """20 tasks each sleep 1 ms in `wait`, then spin 2 ms in `cpu`, both in the step that the
    sleep's end wakes.  The loop was held by `cpu`: for the spins' time while another task was ready, counted once,
    not once per waiting task; what it cost the waiting calls is summed over them and exceeds the run's wall time.
    A thread's stage (a sleeper beside the loop) is never a blocker: only the loop's thread has them."""
    spins, left_wait = [], []

    async def task():
        with instrument.stage("wait"):
            await asyncio.sleep(0.001)
        left_wait.append(time.perf_counter_ns())
        with instrument.stage("cpu"):
            spins.append(spin(2_000_000))

    async def main():
        await asyncio.gather(*(task() for _ in range(20)))

    def beside():
        with instrument.stage("thread"):
            time.sleep(0.05)

    th = threading.Thread(target=beside)
    th.start()
    t0 = time.perf_counter_ns()
    asyncio.run(main())
    wall = time.perf_counter_ns() - t0
    th.join()
    snap = instrument.snapshot()
    w = snap["wait"]
    assert w.calls == 20 and snap["cpu"].calls == 20
    # a spin held the loop while a task was ready if one left `wait` after it (all were due within the first spin)
    last = max(left_wait)
    held_truth = sum(c for _, end, c in spins if end <= last)
    waited_truth = sum(c * sum(1 for x in left_wait if x > end) for _, end, c in spins)
    held, waited = w.loop_blockers, w.loop_blockers_waited
    assert "thread" not in held
    assert held.get("cpu", 0) >= 0.9 * held_truth, (held, held_truth, spins)
    assert held.get("wait", 0) <= 0.25 * held["cpu"], held   # only the steps' own machinery before `wait` exits
    assert waited["cpu"] >= 0.9 * waited_truth, (waited, waited_truth)
    assert waited["cpu"] > wall > held["cpu"], (waited, wall, held)   # summed over 19 waiting calls: not loop time
    assert_figures_hold(w, wall)
    v = w.verdict
    assert v["verdict"] == "loop-blocked", v
    assert "the loop was held by cpu for" in v["reason"] and "waited" in v["reason"] and "in all" in v["reason"], v
    # both figures survive the file and add up across snapshots
    again = Snapshot.from_dict(json.loads(snap.to_json()))["wait"]
    assert again.loop_blockers == held and again.loop_blockers_waited == waited
    both = snap.merge(snap)["wait"]
    assert both.loop_blockers_waited == {p: 2 * v for p, v in waited.items()}
    assert both.loop_blockers == {p: 2 * v for p, v in held.items()}


def test_a_burst_inside_a_child_stage_is_charged_to_the_child(backend):
    """50 tasks serve `req`; one of them bursts 30 ms of CPU in `req/work` every 100 ms, inside the step that resumes
    `req`.  The blocking is `req/work`'s: for the bursts' time (the others are ready throughout them), while `req`,
    whose own CPU is small, holds the loop only for the steps' own machinery."""
    instrument.configure(overhead_budget=None)   # every call read: the stages' CPU time exact, not estimated
    bursts = []

    async def burster(stop):
        for _ in range(5):
            with instrument.stage("req"):
                await asyncio.sleep(0.07)
                with instrument.stage("work"):
                    bursts.append(spin(30_000_000))
        stop.set()

    async def client(stop, i):
        rnd = random.Random(i)   # sleeps of their own: the clients are ready at different moments
        while not stop.is_set():
            with instrument.stage("req"):
                await asyncio.sleep(rnd.uniform(0.005, 0.015))
                with instrument.stage("work"):
                    pass

    async def main():
        stop = asyncio.Event()
        await asyncio.gather(burster(stop), *(client(stop, i) for i in range(49)))

    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    asyncio.run(main())
    wall, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
    snap = instrument.snapshot()
    req, work = snap["req"], snap["req/work"]
    burst_cpu = sum(c for _, _, c in bursts)
    burst_wall = sum(e - s for s, e, _ in bursts)
    # The bursts' CPU is work's, and not req's own as well: req's own CPU (the steps' machinery and the SDK's reads,
    # however slow a build or a load makes them) fits in what the thread spent beside the bursts
    assert work.cpu_total >= 0.9 * burst_cpu and req.cpu_self <= cpu - burst_cpu, (work.cpu_total, req.cpu_self,
                                                                                    cpu, burst_cpu)
    held = req.loop_blockers
    assert held.get("req/work", 0) >= 0.9 * burst_cpu, (held, burst_cpu)
    # each moment is held by one stage: req held the loop only outside the bursts' stretches
    assert held.get("req", 0) <= wall - burst_wall, (held, wall, burst_wall)
    assert req.loop_blockers_waited["req/work"] >= 0.5 * req.split_part("loop_ready"), (req.loop_blockers_waited,
                                                                                      req.wall_split)
    assert_figures_hold(req, wall)
    assert not work.loop_blockers   # `work` never awaits


def test_a_step_with_no_stage_of_its_own_is_held_by_the_stage_around_the_loop(backend):
    """The same tasks spinning outside any stage of their own, with `serve` open around the loop: the spins after
    `wait` closes held the loop in `serve`, the stage innermost-open while they ran."""
    spins, left_wait = [], []

    async def task():
        with instrument.stage("wait"):
            await asyncio.sleep(0.001)
        left_wait.append(time.perf_counter_ns())
        spins.append(spin(2_000_000))

    async def main():
        await asyncio.gather(*(task() for _ in range(20)))

    loop = asyncio.new_event_loop()
    t0 = time.perf_counter_ns()
    try:
        with instrument.stage("serve"):
            loop.run_until_complete(main())
    finally:
        loop.close()
    wall = time.perf_counter_ns() - t0
    w = instrument.snapshot()["serve/wait"]
    last = max(left_wait)
    held_truth = sum(c for _, end, c in spins if end <= last)
    assert w.loop_blockers.get("serve", 0) >= 0.9 * held_truth, (w.loop_blockers, held_truth)
    # each moment is held by one stage: wait held the loop only outside the spins' stretches (a fixed share of
    # serve's failed under the sanitizers' slower machinery)
    assert w.loop_blockers.get("serve/wait", 0) <= wall - sum(e - s for s, e, _ in spins), w.loop_blockers
    assert_figures_hold(w, wall)


def test_a_task_woken_by_another_task_s_step_is_ready_from_the_wake(backend):
    """`setter` spins 20 ms in its stage, sets an event, then spins 5 ms more in the same step; `waiter` awaits the
    event in its own stage.  waiter is ready from the set(), not from the start of the loop iteration: its loop-ready
    time is at most the time from the set() to its resume, as the two tasks' own clocks read it (each set is read
    ten times)."""
    marks = []

    async def waiter(ev):
        with instrument.stage("waiter"):
            await ev.wait()
            marks.append(("resumed", time.perf_counter_ns()))

    async def setter(ev):
        await asyncio.sleep(0)
        with instrument.stage("setter"):
            spin(20_000_000)
            marks.append(("set", time.perf_counter_ns()))
            ev.set()
            spin(5_000_000)

    async def main():
        for _ in range(10):
            ev = asyncio.Event()
            await asyncio.gather(waiter(ev), setter(ev))

    asyncio.run(main())
    s = instrument.snapshot()["waiter"]
    sets = [t for k, t in marks if k == "set"]
    resumes = [t for k, t in marks if k == "resumed"]
    assert len(sets) == len(resumes) == 10 and s.calls == 10
    since_set = sum(r - t for t, r in zip(sets, resumes))
    ready = s.split_part("loop_ready")
    # from the start of the iteration it would hold the 20 ms spins before each set as well
    assert 0 < ready <= since_set, (ready, since_set)
    assert s.loop_blockers.get("setter", 0) <= since_set, s.loop_blockers
