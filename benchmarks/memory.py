"""Memory per stage: what its reads cost, side by side with memory off, in interleaved rounds.

    python benchmarks/memory.py [--rounds 7] [--number 20000]

- a read call (every call read, `overhead_budget=None`) of an empty stage with memory none, host, and host+python:
  ns per enter+exit; the memory read's cost per read call is the difference to memory none in the same round;
- the default configuration (1 % budget) on an empty stage and on a 100 µs stage, memory none against host:
  ns per call, and the SDK's own cost as a share of the recorded time (meta.overhead.estimated_ns);
- memory="python" starts tracemalloc, which slows every allocation: a loop building lists, tracemalloc off
  against on (no stage), the cost the option brings with it.
The C core's own figure per source read (meta.memory.sources[].ns_per_read) is printed too.  Medians; ratios
against the anchor of the same round.
"""
import argparse
import json
import os
import platform
import statistics
import time
import tracemalloc

import instrument
from instrument import _native


def empty_calls(n):
    st = instrument.stage("empty")
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with st:
            pass
    return (time.perf_counter_ns() - t0) / n


def work_calls(n):
    st = instrument.stage("work100us")
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with st:
            end = time.perf_counter_ns() + 100_000
            while time.perf_counter_ns() < end:
                pass
    return (time.perf_counter_ns() - t0) / n


def own_share():
    snap = instrument.snapshot()
    wall = sum(s.wall_total for s in snap if len(s.path) == 1)
    return snap.meta["overhead"]["estimated_ns"] / wall if wall else None


def allocations(n=200):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = [str(i) for i in range(2000)]
        del x
    return (time.perf_counter_ns() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=20000)
    args = ap.parse_args()
    rows = {}
    per_read = {"host": [], "python": []}

    def add(name, v):
        rows.setdefault(name, []).append(v)

    for r in range(args.rounds):
        order = ("none", "host", "host,python") if r % 2 == 0 else ("host,python", "host", "none")
        for mem in order:
            instrument.configure(memory=mem, overhead_budget=None)
            instrument.reset()
            empty_calls(1000)
            add(f"read call, memory={mem}", empty_calls(args.number // 4))
            for s in _native.memory_status():
                if s["active"] and s["name"] in per_read:
                    per_read[s["name"]].append(s["ns_per_read"])
        for mem in ("none", "host") if r % 2 == 0 else ("host", "none"):
            instrument.configure(memory=mem, overhead_budget=0.01)
            instrument.reset()
            add(f"default, empty stage, memory={mem}", empty_calls(args.number))
            add(f"default, own cost share, empty stage, memory={mem}", own_share())
            instrument.reset()
            add(f"default, 100 µs stage, memory={mem}", work_calls(max(args.number // 40, 200)))
            add(f"default, own cost share, 100 µs stage, memory={mem}", own_share())
        instrument.configure(memory="host")
        for on in (False, True) if r % 2 == 0 else (True, False):
            if on:
                tracemalloc.start()
            add(f"list building, tracemalloc {'on' if on else 'off'}", allocations())
            if on:
                tracemalloc.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, Python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
          f"{args.rounds} rounds")
    for k, v in med.items():
        print(f"{k:55s} {v:12.4f}" if "share" in k else f"{k:55s} {v:12.1f}")
    base = med["read call, memory=none"]
    print(f"memory read per read call, host: {med['read call, memory=host'] - base:.0f} ns "
          f"(x{med['read call, memory=host'] / base:.2f} a read call); host+python: "
          f"{med['read call, memory=host,python'] - base:.0f} ns")
    print(f"C core's own figure per source read (one boundary): host {statistics.median(per_read['host']):.0f} ns, "
          f"python {statistics.median(per_read['python']):.0f} ns")
    print(f"default, empty stage: host / none {med['default, empty stage, memory=host'] / med['default, empty stage, memory=none']:.3f}; "
          f"100 µs stage: {med['default, 100 µs stage, memory=host'] / med['default, 100 µs stage, memory=none']:.3f}")
    print(f"tracemalloc on / off, list building: "
          f"{med['list building, tracemalloc on'] / med['list building, tracemalloc off']:.2f}")
    print(json.dumps({"medians": med}))


if __name__ == "__main__":
    main()
