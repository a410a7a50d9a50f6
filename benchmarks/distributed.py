"""Cost of the torch.distributed hooks and of instrument.distributed.gather, against the bare collective.

    python benchmarks/distributed.py [--world 2] [--rounds 15] [--calls 300] [--json out.json]

Ranks are processes of torch.multiprocessing.spawn on gloo (CPU tensors, loopback), in the default
configuration.  Two sets of interleaved rounds, their order shuffled each round (the same on every rank):

- hooks: all_reduce of 1 and of 65,536 floats, `calls` calls inside an open stage, with torch's own
  function, with the timed one (a child stage `dist.all_reduce` per call), and with the timed one in
  the timing-only configuration (no counters, no user/system split: the stage reads no more than the
  clocks); per call, and the median of the differences paired by round.  The hook alone is also
  timed around a function that does nothing (its exact cost, given as a share of the bare all_reduce).
- gather: instrument.distributed.gather of a snapshot of 20 and of 200 stages, and the bare collectives
  that move the same bytes (an all_gather of the sizes and a gather of a uint8 tensor of the largest
  rank's compressed snapshot); per call.

Rank 0 prints the medians of the rounds, the ratios against the bare collective measured in the same
rounds, and the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import instrument  # noqa: E402
import instrument.distributed  # noqa: E402
from instrument import config  # noqa: E402
from instrument.live import distributed as live_distributed  # noqa: E402

OWN = dist.distributed_c10d   # torch's own functions (torch.distributed's are the timed ones while on)


TIMING_ONLY = {"counters": "none", "cpu_split": False}


def per_call(fn, calls, options=None):
    if options:
        instrument.configure(**options)
    try:
        return _per_call(fn, calls)
    finally:
        if options:
            instrument.configure(**{k: config.BY_NAME[k].default for k in options})


def _per_call(fn, calls):
    OWN.barrier()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def hook_cases(calls):
    outer = instrument.stage("bench")
    cases = {}
    for n in (1, 65536):
        t = torch.ones(n)

        def own(t=t):
            with outer:
                for _ in range(calls):
                    OWN.all_reduce(t)

        def timed(t=t):
            with outer:
                for _ in range(calls):
                    dist.all_reduce(t)
        cases[f"all_reduce {n} floats, torch's own"] = (own, calls)
        cases[f"all_reduce {n} floats, timed (dist.all_reduce stage)"] = (timed, calls)
        cases[f"all_reduce {n} floats, timed, timing only"] = (timed, calls, TIMING_ONLY)
    nothing = lambda: None   # noqa: E731
    hooked = live_distributed._timed("all_reduce", nothing, lambda: False)
    for name, fn in (("a function that does nothing", nothing), ("the same, hooked", hooked)):
        def run(fn=fn):
            with outer:
                for _ in range(calls * 10):
                    fn()
        cases[name] = (run, calls * 10)
    return cases


def bare_gather(nbytes):
    """The collectives gather() makes, moving the same bytes, without the snapshot around them."""
    world, rank = dist.get_world_size(), dist.get_rank()

    def run():
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        OWN.all_gather(sizes, torch.tensor([nbytes], dtype=torch.int64))
        buf = torch.zeros(nbytes, dtype=torch.uint8)
        OWN.gather(buf, [torch.empty(nbytes, dtype=torch.uint8) for _ in range(world)] if rank == 0 else None, dst=0)
    return run


def gather_cases(stages):
    """A snapshot of `stages` stages, and gather() against its bare collectives."""
    instrument.reset()
    with instrument.stage("step"):
        for i in range(stages - 1):
            with instrument.stage(f"part{i}"):
                pass
    mine = len(zlib.compress(instrument.snapshot().to_json(percentiles=False).encode(), 1))
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    OWN.all_gather(sizes, torch.tensor([mine], dtype=torch.int64))
    nbytes = int(max(sizes))
    return {f"gather(), {stages} stages ({nbytes:,} bytes compressed)": (instrument.distributed.gather, 1),
            f"bare collectives of gather(), {stages} stages": (bare_gather(nbytes), 1)}


def rank_main(rank, world, a, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    results = {}
    phases = [(lambda: hook_cases(a.calls), 1)] + [(lambda s=s: gather_cases(s), a.gathers) for s in (20, 200)]
    for make, reps in phases:   # each phase's recording made when its rounds start
        cases = make()
        for name in cases:
            results.setdefault(name, [])
        for r in range(a.rounds):
            order = list(cases)
            random.Random(r).shuffle(order)
            for name in order:
                fn, inner, *options = cases[name]
                results[name].append(per_call(fn, reps, *options) / inner)
    if rank == 0:
        report(results, world, a)
    dist.destroy_process_group()


def report(results, world, a):
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{world} ranks (gloo, loopback), {a.rounds} interleaved rounds, medians; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; {platform.platform()}")
    for k, v in med.items():
        print(f"  {k:<62} {v:>14,.0f} ns")
    for n in (1, 65536):
        own = results[f"all_reduce {n} floats, torch's own"]
        for what in ("timed (dist.all_reduce stage)", "timed, timing only"):
            timed = results[f"all_reduce {n} floats, {what}"]
            paired = statistics.median(t - o for t, o in zip(timed, own))
            print(f"  hooks, all_reduce {n} floats, {what}: {paired:+,.0f} ns per call (paired median), ratio "
                  f"{statistics.median(timed) / statistics.median(own):.3f}")
    hook, bare = med["the same, hooked"] - med["a function that does nothing"], med["all_reduce 1 floats, torch's own"]
    print(f"  the hook's own cost: {hook:,.0f} ns per call, {hook / bare:.4f} of the bare all_reduce of 1 float")
    for s in (20, 200):
        g = next(v for k, v in med.items() if k.startswith(f"gather(), {s} stages"))
        b = med[f"bare collectives of gather(), {s} stages"]
        print(f"  gather, {s} stages: {g / 1e6:.2f} ms, ratio {g / b:.2f} to its bare collectives ({b / 1e6:.2f} ms)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"world": world, "rounds": a.rounds, "load": os.getloadavg(), "medians_ns": med,
                       "rounds_ns": results}, f, indent=2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=300, help="all_reduce calls per round and case")
    p.add_argument("--gathers", type=int, default=5, help="gathers per round and case")
    p.add_argument("--json")
    a = p.parse_args(argv)
    store = os.path.join(tempfile.mkdtemp(prefix="instrument-bench-"), "store")
    mp.spawn(rank_main, args=(a.world, a, store), nprocs=a.world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
