"""Cost of instrument.add and of a root stage with exemplars, side by side with a plain stage, in one process.

    python benchmarks/items_exemplars.py [--rounds 15] [--number 100000] [--requests 1000000] [--json out.json]

Each candidate is a loop of `number` operations timed in interleaved rounds (the
order shuffled each round); the figure is the median ns per operation with the
cost of the empty loop removed; the ratios are taken against the plain stage
measured in the same rounds.  The memory part runs `requests` requests
(request -> pre, forward, post) with exemplars on and reads RSS and the
exemplar state before and after.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time

import instrument
from instrument.live import backend as live_backend

TIMING = dict(enabled=True, counters="none", cpu_clock=False, nvtx=False, trace_events=0)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def candidates():
    """name -> (function of n, exemplars option)."""
    root, inner, req = instrument.stage("bench_root"), instrument.stage("bench_inner"), instrument.stage("bench_req")
    add = instrument.add

    def empty(n):
        for _ in range(n):
            pass

    def stage(n):
        for _ in range(n):
            with root:
                pass

    def nested(n):   # a stage inside an open root call: its self time goes into the call's breakdown
        with req:
            for _ in range(n):
                with inner:
                    pass

    def add_value(n):
        with req:
            for _ in range(n):
                add("tokens", 3)

    def add_default(n):
        with req:
            for _ in range(n):
                add("tokens")

    return {
        "empty loop": (empty, 0),
        "plain stage (exemplars off)": (stage, 0),
        "root stage, exemplars on (K=32)": (stage, 32),
        "nested stage, exemplars off": (nested, 0),
        "nested stage in an open root call, exemplars on": (nested, 32),
        "add('tokens', 3) in a stage": (add_value, 0),
        "add('tokens') in a stage": (add_default, 0),
    }


def measure(rounds: int, number: int) -> dict:
    cands = candidates()
    samples = {k: [] for k in cands}
    for _ in range(rounds):
        order = list(cands)
        random.shuffle(order)
        for k in order:
            fn, xm = cands[k]
            instrument.configure(**TIMING, exemplars=xm)
            instrument.reset()
            gc.disable()
            try:
                t0 = time.perf_counter_ns()
                fn(number)
                samples[k].append((time.perf_counter_ns() - t0) / number)
            finally:
                gc.enable()
    loop = statistics.median(samples.pop("empty loop"))
    return {k: statistics.median(v) - loop for k, v in samples.items()}


def memory(requests: int) -> dict:
    instrument.configure(**TIMING, exemplars=32)
    instrument.reset()
    req = instrument.stage("request")
    stages = [instrument.stage(n) for n in ("pre", "forward", "post")]

    def run(n):
        for _ in range(n):
            with req:
                for s in stages:
                    with s:
                        pass
    run(20_000)
    xm_before = instrument.snapshot().meta["exemplars"]["bytes"]   # before RSS is read: the snapshot's own objects
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    run(requests)
    secs = time.perf_counter() - t0
    gc.collect()
    after = rss_bytes()
    xm_after = instrument.snapshot().meta["exemplars"]["bytes"]
    return {"requests": requests, "rss_before": before, "rss_after": after, "rss_delta": after - before,
            "exemplar_bytes_before": xm_before, "exemplar_bytes_after": xm_after, "seconds": secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--number", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args()
    ns = measure(a.rounds, a.number)
    plain = ns["plain stage (exemplars off)"]
    ratios = {
        "root stage with exemplars / plain stage": (ns["root stage, exemplars on (K=32)"] / plain, 1.5),
        "nested stage in a root call with exemplars / nested stage without": (
            ns["nested stage in an open root call, exemplars on"] / ns["nested stage, exemplars off"], None),
        "add('tokens', 3) / plain stage enter+exit": (ns["add('tokens', 3) in a stage"] / plain, 0.5),
        "add('tokens') / plain stage enter+exit": (ns["add('tokens') in a stage"] / plain, 0.5),
    }
    mem = memory(a.requests)
    print(f"backend: {live_backend.name}; python {platform.python_version()}; {os.cpu_count()} CPUs")
    print("\n| candidate | ns |\n| --- | ---: |")
    for k, v in ns.items():
        print(f"| {k} | {v:,.1f} |")
    print("\n| ratio | value | target | |\n| --- | ---: | ---: | --- |")
    for k, (v, target) in ratios.items():
        verdict = "" if target is None else "met" if v <= target else "NOT met"
        print(f"| {k} | {v:.2f} | {'≤ ' + str(target) if target is not None else ''} | {verdict} |")
    print(f"\nmemory: {mem['requests']:,} requests (request -> pre, forward, post) in {mem['seconds']:.1f} s: "
          f"RSS {mem['rss_delta'] / 2**20:+.2f} MiB; exemplar state {mem['exemplar_bytes_before']:,} -> "
          f"{mem['exemplar_bytes_after']:,} bytes for one root stage")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ns": ns, "ratios": {k: v for k, (v, _) in ratios.items()}, "memory": mem,
                       "backend": live_backend.name, "python": sys.version}, f, indent=2)


if __name__ == "__main__":
    main()
