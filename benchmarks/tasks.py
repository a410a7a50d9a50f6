"""Cost of asyncio attribution, side by side with an uninstrumented asyncio, in one process.

    python benchmarks/tasks.py [--rounds 21] [--tasks 50] [--steps 100] [--work-us 0,10,50] [--json out.json]
    python benchmarks/tasks.py --nested 3 --tasks 10000 --steps 1 --work-us 0 --rounds 11
    python benchmarks/tasks.py --loop uvloop ...     (the same on uvloop: the coroutine wrapper's cost)

With `--nested N`, each task opens N nested stages around its steps (the many-tasks workload: 10,000 tasks, 3
stages, one `await asyncio.sleep(0)` each).  The load average is printed beside every figure.

The workload: `--tasks` tasks, each inside one stage for its whole life, each doing
`--steps` task steps of `--work-us` microseconds of Python work followed by
`await asyncio.sleep(0)` (a task switch).  With 0 µs of work, the time per step is
the cost of one task switch; the difference to the uninstrumented run is what
the SDK adds to a switch.  With work, it is the throughput of many short task
steps.  Every configuration runs in each round, in a shuffled order; figures are
medians over the rounds, and ratios are taken within the same run.

Cost is the loop thread's CPU time per step (CLOCK_THREAD_CPUTIME_ID): the
workload never blocks, so on an idle machine it equals the wall time, and on a
shared one it leaves out the time other processes took the core (wall time per
step is kept in the JSON too).  Throughput is steps per CPU-second.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import sys
import time

import instrument
from instrument.live import backend as live_backend, collector as _collector, tasks as live_tasks

TIMING = dict(enabled=True, counters="none", cpu_clock=False, nvtx=False, trace_events=0)
CONFIGS = {
    "uninstrumented": dict(TIMING, enabled=False, task_attribution=False),
    "SDK off (disabled, hook installed)": dict(TIMING, enabled=False, task_attribution=True),
    "timing only, attribution off": dict(TIMING, task_attribution=False),
    "timing only, attribution on": dict(TIMING, task_attribution=True),
    "timing + cpu clock, attribution on": dict(TIMING, cpu_clock=True, task_attribution=True),
    "default, attribution off": dict(task_attribution=False),
    "default, attribution on": dict(task_attribution=True),
}


def calibrate(us: float):
    """A Python work function of about `us` microseconds of CPU (loop count calibrated on this machine,
    by the least disturbed of several tries)."""
    if us <= 0:
        return lambda: None

    def work(n):
        x = 0
        for i in range(n):
            x += i * i
        return x
    n = 20_000
    per = min(_cpu_ns(lambda: [work(n) for _ in range(20)]) / 20 for _ in range(15))
    k = max(1, int(n * us * 1000 / per))
    return lambda: work(k)


def _cpu_ns(f) -> int:
    t0 = time.thread_time_ns()
    f()
    return time.thread_time_ns() - t0


LOOPS = {"asyncio": lambda: asyncio.new_event_loop(), "uvloop": lambda: __import__("uvloop").new_event_loop()}
_loop = "asyncio"   # --loop


def run_once(tasks: int, steps: int, work, nested: int = 1) -> tuple:
    """(CPU ns, wall ns) per task step of one run of the workload."""
    stages = [instrument.stage(f"task{k}" if k else "task") for k in range(max(nested, 1))]

    async def steps_in(k):
        if k < len(stages):
            with stages[k]:
                await steps_in(k + 1)
            return
        for _ in range(steps):
            work()
            await asyncio.sleep(0)

    async def task():
        await steps_in(0)

    async def main():
        await asyncio.gather(*(task() for _ in range(tasks)))

    loop = LOOPS[_loop]()
    try:
        gc.disable()
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        loop.run_until_complete(main())
        dt, dc = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
    finally:
        gc.enable()
        loop.close()
    return dc / (tasks * steps), dt / (tasks * steps)


def measure(rounds: int, tasks: int, steps: int, work_us: float, nested: int = 1) -> dict:
    base = _collector.current_config().values
    work = calibrate(work_us)
    cpu = {k: [] for k in CONFIGS}
    wall = {k: [] for k in CONFIGS}
    for _ in range(rounds):
        order = list(CONFIGS)
        random.shuffle(order)
        for k in order:
            instrument.configure(**dict(base, **CONFIGS[k]))
            instrument.reset()
            c, w = run_once(tasks, steps, work, nested)
            cpu[k].append(c)
            wall[k].append(w)
    instrument.configure(**base)
    instrument.reset()
    return ({k: statistics.median(v) for k, v in cpu.items()}, {k: statistics.median(v) for k, v in wall.items()})


def reads_per_step(tasks: int, steps: int, nested: int = 1) -> dict:
    """How many readings the step hook took per task step (default configuration, attribution on)."""
    base = _collector.current_config().values
    instrument.configure(**dict(base, task_attribution=True))
    instrument.reset()
    before = live_backend.current.collect()["tasks"]
    run_once(tasks, steps, lambda: None, nested)
    after = live_backend.current.collect()["tasks"]
    instrument.configure(**base)
    return {k: (after[k] - before[k]) / (tasks * steps) for k in ("steps", "switch_reads")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--work-us", default="0,10,50", help="comma list of µs of work per step")
    ap.add_argument("--nested", type=int, default=1, help="stages each task opens, nested")
    ap.add_argument("--loop", choices=sorted(LOOPS), default="asyncio")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    global _loop
    _loop = a.loop
    load0 = os.getloadavg()[0]
    out = {"machine": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
           "backend": live_backend.name, "loop": a.loop, "tasks": a.tasks, "steps": a.steps, "rounds": a.rounds,
           "mechanism": live_tasks.MECHANISM_UVLOOP if a.loop == "uvloop" else live_tasks.MECHANISM,
           "reads_per_step": reads_per_step(a.tasks, a.steps, a.nested), "runs": {}}
    for us in (float(x) for x in a.work_us.split(",")):
        la = os.getloadavg()[0]
        res, wall = measure(a.rounds, a.tasks, a.steps, us, a.nested)
        la = (la + os.getloadavg()[0]) / 2
        out["runs"][str(us)] = {"cpu_ns_per_step": res, "wall_ns_per_step": wall, "loadavg": la}
        base = res["uninstrumented"]
        print(f"\n{a.loop}: {us:g} µs of work per step, {a.tasks} tasks x {a.steps} steps, {a.nested} nested "
              f"stage(s), median "
              f"of {a.rounds} rounds, load average {la:.2f} (CPU ns of the loop thread per step; wall in brackets)")
        print(f"{'configuration':40} {'ns/step':>9} {'+ns/switch':>10} {'steps/CPU-s':>12} {'(wall ns)':>10}")
        for k, v in res.items():
            print(f"{k:40} {v:9,.0f} {v - base:10,.0f} {1e9 / v:12,.0f} {wall[k]:10,.0f}")
        t, d = res["timing only, attribution on"], res["default, attribution on"]
        print(f"throughput default / timing only (attribution on): {t / d:.3f}  (target >= 0.9; load {la:.2f})")
        print(f"throughput default / uninstrumented: {base / d:.3f};  timing only / uninstrumented: {base / t:.3f}")
    print(f"\nreadings per task step (default, attribution on): {out['reads_per_step']}; load average {load0:.2f} at "
          f"start, {os.getloadavg()[0]:.2f} at the end")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
