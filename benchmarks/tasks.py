"""Cost of asyncio attribution, side by side with an uninstrumented asyncio, in one process.

    python benchmarks/tasks.py [--rounds 9] [--tasks 50] [--steps 400] [--work-us 0,10,50] [--json out.json]

The workload: `--tasks` tasks, each inside one stage for its whole life, each doing
`--steps` task steps of `--work-us` microseconds of Python work followed by
`await asyncio.sleep(0)` (a task switch).  With 0 µs of work, the time per step is
the cost of one task switch; the difference to the uninstrumented run is what
the SDK adds to a switch.  With work, it is the throughput of many short task
steps.  Every configuration runs in each round, in a shuffled order; figures are
medians over the rounds, and ratios are taken within the same run.
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
    """A Python work function of about `us` microseconds (loop count calibrated on this machine)."""
    if us <= 0:
        return lambda: None

    def work(n):
        x = 0
        for i in range(n):
            x += i * i
        return x
    n = 1000
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(50):
            work(n)
        per = (time.perf_counter_ns() - t0) / 50
        if per > 200_000:
            break
        n *= 2
    k = max(1, int(n * us * 1000 / per))
    return lambda: work(k)


def run_once(tasks: int, steps: int, work) -> float:
    """ns per task step of one run of the workload."""
    st = instrument.stage("task")

    async def task():
        with st:
            for _ in range(steps):
                work()
                await asyncio.sleep(0)

    async def main():
        await asyncio.gather(*(task() for _ in range(tasks)))

    loop = asyncio.new_event_loop()
    try:
        gc.disable()
        t0 = time.perf_counter_ns()
        loop.run_until_complete(main())
        dt = time.perf_counter_ns() - t0
    finally:
        gc.enable()
        loop.close()
    return dt / (tasks * steps)


def measure(rounds: int, tasks: int, steps: int, work_us: float) -> dict:
    base = _collector.current_config().values
    work = calibrate(work_us)
    samples = {k: [] for k in CONFIGS}
    for _ in range(rounds):
        order = list(CONFIGS)
        random.shuffle(order)
        for k in order:
            instrument.configure(**dict(base, **CONFIGS[k]))
            instrument.reset()
            samples[k].append(run_once(tasks, steps, work))
    instrument.configure(**base)
    instrument.reset()
    return {k: statistics.median(v) for k, v in samples.items()}


def reads_per_step(tasks: int, steps: int) -> dict:
    """How many readings the step hook took per task step (default configuration, attribution on)."""
    base = _collector.current_config().values
    instrument.configure(**dict(base, task_attribution=True))
    instrument.reset()
    before = live_backend.current.collect()["tasks"]
    run_once(tasks, steps, lambda: None)
    after = live_backend.current.collect()["tasks"]
    instrument.configure(**base)
    return {k: (after[k] - before[k]) / (tasks * steps) for k in ("steps", "switch_reads")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--work-us", default="0,10,50", help="comma list of µs of work per step")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    out = {"machine": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
           "backend": live_backend.name, "tasks": a.tasks, "steps": a.steps, "rounds": a.rounds,
           "mechanism": live_tasks.MECHANISM, "reads_per_step": reads_per_step(a.tasks, a.steps), "runs": {}}
    for us in (float(x) for x in a.work_us.split(",")):
        res = measure(a.rounds, a.tasks, a.steps, us)
        out["runs"][str(us)] = res
        base = res["uninstrumented"]
        print(f"\n{us:g} µs of work per step, {a.tasks} tasks x {a.steps} steps, median of {a.rounds} rounds")
        print(f"{'configuration':40} {'ns/step':>9} {'+ns/switch':>10} {'steps/s':>10}")
        for k, v in res.items():
            print(f"{k:40} {v:9,.0f} {v - base:10,.0f} {1e9 / v:10,.0f}")
        t, d = res["timing only, attribution on"], res["default, attribution on"]
        print(f"throughput default / timing only (attribution on): {t / d:.3f}  (target >= 0.8)")
        print(f"throughput default / uninstrumented: {base / d:.3f};  timing only / uninstrumented: {base / t:.3f}")
    print("\nreadings per task step (default, attribution on):", out["reads_per_step"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
