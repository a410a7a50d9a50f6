"""Truth under load: wall time beside a CPU hog on the same core, and sampled estimates against the truth.

    python benchmarks/under_load.py [--runs 12] [--json out.json]

1. Wall time: a CPU hog pinned to one core, and a child process pinned to the same core timing 50 calls of
   `with stage("spin"): sum(range(100000))` with its own perf_counter_ns: its own total against the SDK's wall
   total, for counters none / none with the CPU clock off / the default, on both backends.
2. Estimates: bimodal page faults (5 % of calls fault 256 pages) and Pareto busy-waits (median 8.5 µs) at the
   default budget, `--runs` runs each: the estimate against the truth the run measured itself (the thread's minor
   faults; the CPU each busy-wait measured of itself and the thread CPU around each call), and whether the truth
   lies inside the 99 % interval.

Every figure is printed with the load average at the time.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import random
import resource
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time
os.sched_setaffinity(0, {0})
import instrument
from instrument.live import collector, pure
if sys.argv[1] == "pure":
    collector.use_backend(pure)
st = instrument.stage("spin")
own = 0
for _ in range(50):
    t = time.perf_counter_ns()
    with st:
        sum(range(100000))
    own += time.perf_counter_ns() - t
print(json.dumps({"own": own, "sdk": instrument.snapshot()["spin"].wall_total}))
"""

CONFIGS = {"counters none": {"INSTRUMENT_COUNTERS": "none"},
           "counters none, CPU clock off": {"INSTRUMENT_COUNTERS": "none", "INSTRUMENT_CPU_CLOCK": "0"},
           "default": {}}


def load() -> float:
    return os.getloadavg()[0]


def wall_beside_a_hog() -> list:
    hog = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"])
    rows = []
    try:
        time.sleep(0.5)
        for backend in ("native", "pure"):
            for name, env in CONFIGS.items():
                r = subprocess.run([sys.executable, "-c", CHILD, backend], env=dict(os.environ, **env),
                                   capture_output=True, text=True, timeout=300)
                if r.returncode != 0:
                    rows.append({"backend": backend, "config": name, "error": r.stderr.strip()[-200:]})
                    continue
                d = json.loads(r.stdout.strip().splitlines()[-1])
                rows.append({"backend": backend, "config": name, "own_ms": d["own"] / 1e6, "sdk_ms": d["sdk"] / 1e6,
                             "ratio": d["sdk"] / d["own"], "loadavg": load()})
    finally:
        hog.kill()
        hog.wait()
    return rows


def touch(pages: int) -> None:
    if pages:
        m = mmap.mmap(-1, pages * mmap.PAGESIZE)
        for k in range(0, pages * mmap.PAGESIZE, mmap.PAGESIZE):
            m[k] = 1
        m.close()


def busy_ns(ns: int) -> int:
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < ns:
        pass
    return time.thread_time_ns() - t0


def estimates(runs: int) -> dict:
    import instrument
    from instrument.snapshot import ci99
    out = {"bimodal page faults": [], "pareto CPU": []}
    for k in range(runs):
        rng = random.Random(1000 + k)
        instrument.reset()
        st = instrument.stage("touch")
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(3000):
            with st:
                touch(256 if rng.random() < 0.05 else 0)
        truth = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
        c = instrument.snapshot()["touch"].counters["page-faults"]
        lo, hi = ci99(c["total"], c.get("var", 0.0))
        out["bimodal page faults"].append({"truth": truth, "estimate": c["total"], "ci99": [lo, hi],
                                           "inside": lo - 0.002 * truth - 2 <= truth <= hi + 0.002 * truth + 2,
                                           "reads": c["read_calls"], "loadavg": load()})
        instrument.reset()
        st = instrument.stage("wait")
        mine = outer = 0
        t0 = time.thread_time_ns()
        for _ in range(6000):
            d = int(6_000 * rng.paretovariate(2.0))
            a = time.thread_time_ns()
            with st:
                mine += busy_ns(d)
            outer += time.thread_time_ns() - a
        s = instrument.snapshot()["wait"]
        thread = time.thread_time_ns() - t0
        lo, hi = ci99(s.cpu_total, s.cpu_var)
        out["pareto CPU"].append({"own": mine, "around_calls": outer, "thread": thread, "estimate": s.cpu_total,
                                  "ci99": [lo, hi], "inside": lo <= outer and hi >= mine,
                                  "over_thread": s.cpu_total / thread, "reads": s.cpu_reads, "loadavg": load()})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    print(f"{platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}")
    wall = wall_beside_a_hog()
    print("wall time beside a CPU hog on the same core (50 calls; SDK wall total / the loop's own total):")
    for r in wall:
        if "error" in r:
            print(f"  {r['backend']:6} {r['config']:30} failed: {r['error']}")
        else:
            print(f"  {r['backend']:6} {r['config']:30} own {r['own_ms']:8.1f} ms  SDK {r['sdk_ms']:8.1f} ms  "
                  f"ratio {r['ratio']:.3f}  (load {r['loadavg']:.2f})")
    est = estimates(a.runs)
    for name, rows in est.items():
        inside = sum(r["inside"] for r in rows)
        loads = [r["loadavg"] for r in rows]
        print(f"{name}: truth inside the 99 % interval in {inside} of {len(rows)} runs (load {min(loads):.2f}-"
              f"{max(loads):.2f})")
        for r in rows:
            if name.startswith("bimodal"):
                print(f"  truth {r['truth']:7,}  estimate {r['estimate']:9,.0f}  ci99 [{r['ci99'][0]:9,.0f}, "
                      f"{r['ci99'][1]:9,.0f}]  reads {r['reads']:4}  load {r['loadavg']:.2f}")
            else:
                print(f"  own {r['own'] / 1e6:6.1f} ms  around calls {r['around_calls'] / 1e6:6.1f} ms  estimate "
                      f"{r['estimate'] / 1e6:6.1f} ms  ci99 [{r['ci99'][0] / 1e6:6.1f}, {r['ci99'][1] / 1e6:6.1f}]  "
                      f"/ thread CPU {r['over_thread']:.3f}  reads {r['reads']:4}  load {r['loadavg']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"wall": wall, "estimates": est, "date": time.strftime("%Y-%m-%d"),
                       "machine": platform.platform()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
