"""What the pure-Python fallback costs beside the C core: a reused no-op stage's enter+exit on each backend.

    python benchmarks/fallback_cost.py [--rounds 15]

Each round times both backends, each in a fresh interpreter (the backend is chosen at import:
INSTRUMENT_PURE_PYTHON=1 for the fallback), so load on the machine falls on both alike; the figure is the
median over rounds of the mean µs per `with stage: pass` (loop overhead included, a few tens of ns).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ONE_RUN = """
import timeit, instrument
from instrument.live import backend
S = instrument.stage("noop")
n = {number}
print(backend.name, timeit.timeit("with S: pass", globals={{"S": S}}, number=n) / n * 1e6)
"""


def one_run(pure: bool, number: int) -> tuple:
    env = dict(os.environ, INSTRUMENT_PURE_PYTHON="1" if pure else "0")
    out = subprocess.run([sys.executable, "-c", ONE_RUN.format(number=number)], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], float(out[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args(argv)
    runs = {"native": [], "pure": []}
    for _ in range(a.rounds):
        for pure, number in ((False, 200_000), (True, 5_000)):
            name, us = one_run(pure, number)
            runs[name].append(us)
    for name, values in runs.items():
        if values:
            print(f"{name:>6}: {statistics.median(values):8.2f} µs per no-op stage (median of {len(values)} runs; "
                  f"{min(values):.2f}-{max(values):.2f})")
    if runs["native"] and runs["pure"]:
        print(f"fallback / C core: {statistics.median(runs['pure']) / statistics.median(runs['native']):.0f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
