"""Cost of the per-call snapshot writer (instrument.start_snapshot_writer: the worker's
file rewritten after every outermost stage exit), side by side with its anchors.

    python benchmarks/snapshot_writer.py [--rounds 9] [--calls 300] [--json out.json]

For a request of the example service's shape (a root stage and five children) and
for a larger tree (a root and 60 children), in interleaved rounds (order shuffled
each round): the time of one outermost call without a writer, with the periodic
writer only, and with the per-call writer; the anchor is one real request of the
example service's model (EmbeddingService.embed of 8 sentences) timed in the same
rounds when the model package is installed.  Figures are medians of the rounds.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import instrument  # noqa: E402


def tree(children):
    root = instrument.stage("request")
    kids = [instrument.stage(f"step{i}") for i in range(children)]

    def call():
        with root:
            for k in kids:
                with k:
                    pass
    return call


def timed(fn, calls):
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--json")
    a = p.parse_args(argv)
    instrument.configure(counters="none", nvtx=False)
    folder = tempfile.mkdtemp(prefix="instrument-bench-")
    embed = None
    try:
        from instrument.demo import batches, load_sentences
        from instrument.demo.service import EmbeddingService
        service = EmbeddingService("optimized", "cpu")
        texts = next(iter(batches(load_sentences(), 1, 8)))
        service.encode(texts)
        embed = lambda: service.encode(texts)   # noqa: E731  (unstaged: the model's own time)
    except Exception as e:   # no model package: no anchor
        print(f"(no request anchor: {e})", file=sys.stderr)

    cases = {}
    for kids in (5, 60):
        call = tree(kids)
        cases[f"root + {kids} children, no writer"] = (call, None)
        cases[f"root + {kids} children, periodic writer (5 s)"] = (call, False)
        cases[f"root + {kids} children, per-call writer"] = (call, True)
    results = {k: [] for k in cases}
    if embed is not None:
        results["anchor: one request of the example model (8 sentences)"] = []
    for r in range(a.rounds):
        order = list(results)
        random.Random(r).shuffle(order)
        for name in order:
            if name.startswith("anchor"):
                results[name].append(timed(embed, max(3, a.calls // 100)))
                continue
            call, every = cases[name]
            instrument.reset()
            if every is not None:
                instrument.start_snapshot_writer(folder, interval=5.0, every_call=every)
            for _ in range(20):
                call()   # the tree exists, the file has its size
            results[name].append(timed(call, a.calls))
            if every is not None:
                instrument.stop_snapshot_writer()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{platform.node()} {platform.machine()} python {platform.python_version()}, {a.rounds} rounds, "
          f"backend {instrument.snapshot().meta['backend']['name']}")
    for k, v in med.items():
        print(f"  {k:<55} {v / 1e3:10.1f} µs")
    for kids in (5, 60):
        base = med[f"root + {kids} children, no writer"]
        extra = med[f"root + {kids} children, per-call writer"] - base
        line = f"  per-call writer, {kids} children: +{extra / 1e3:.0f} µs per outermost call"
        anchor = med.get("anchor: one request of the example model (8 sentences)")
        if anchor:
            line += f" = {100 * extra / anchor:.1f} % of one example request ({anchor / 1e6:.1f} ms)"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"median_ns": med, "rounds": a.rounds}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
