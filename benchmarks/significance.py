"""How often does `instrument diff` call noise a change, and how often does it see a real one?

(Both sides' iteration counts are made the same way, `int(base * factor)`: a loop bound
that is the literal constant ran 2-3 % slower here than one computed by int(), a real
difference the paired test found when the "identical" sides were made differently.)

Repeated trials of a real workload (a pure-Python loop of ~20 µs per call in a stage),
compared with itself and with versions doing 10 % and 30 % more iterations:

- turns:   both sides take turns in chunks (each chunk a snapshot, merged per side), the
           first of each turn alternating, as `instrument demo` runs its variants: the
           paired-windows test;
- windows: the same chunks, but all of one side before all of the other: Welch on windows;
- calls:   one window a side, the two alternating every 50 calls in one recording:
           the rank test on the histograms;
- runs:    one window a side, one side after the other (two plain runs): the rank test.

    python benchmarks/significance.py [--trials 40] [--turns 40] [--calls 200]

Prints, per design and slowdown, the share of trials flagged beyond noise (and in
which direction), the median estimate and the median interval width.
"""
import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import instrument  # noqa: E402
from instrument.analysis.diff import diff  # noqa: E402


def work(stage, calls, iterations):
    for _ in range(calls):
        with stage:
            x = 0
            for i in range(iterations):
                x += i * i


def chunks(slower, turns, calls, interleave, base=400):
    spin = instrument.stage("spin")
    order = [(k, side) for k in range(turns) for side in ((0, 1) if k % 2 == 0 else (1, 0))]   # ABBA: no side
    # always goes first
    if not interleave:
        order.sort(key=lambda x: x[1])
    parts = ([], [])
    for _, side in order:
        instrument.reset()
        work(spin, calls, int(base * (1.0, slower)[side]))   # both sides' counts made alike
        parts[side].append(instrument.snapshot())
    return parts[0][0].merge(*parts[0][1:]), parts[1][0].merge(*parts[1][1:])


def one_window(slower, turns, calls, interleave, base=400):
    a, b = instrument.stage("side_a"), instrument.stage("side_b")
    instrument.reset()
    total = turns * calls
    if interleave:
        for k in range(total // 50):
            for st_, it in ((a, int(base * 1.0)), (b, int(base * slower)))[:: 1 if k % 2 == 0 else -1]:
                work(st_, 50, it)
    else:
        work(a, total, int(base * 1.0))
        work(b, total, int(base * slower))
    s = instrument.snapshot()
    return tuple(instrument.Snapshot([replace(s[n], path=("spin",))], s.meta) for n in ("side_a", "side_b"))


DESIGNS = {"turns": (chunks, True), "windows": (chunks, False), "calls": (one_window, True),
           "runs": (one_window, False)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--designs", default=",".join(DESIGNS))
    a = p.parse_args()
    work(instrument.stage("spin"), 2000, 400)
    print(f"{a.trials} trials per cell, {a.turns} chunks x {a.calls} calls a side, alpha 0.01, min_change 3 %")
    print(f"{'design':<8} {'workload':<12} {'flagged':>8} {'slower':>7} {'faster':>7} {'median est':>11} "
          f"{'median width':>13} {'basis':>8} {'s/trial':>8}")
    for name in a.designs.split(","):
        make, inter = DESIGNS[name]
        for slower in (1.0, 1.1, 1.3):
            flags, up, down, est, width, basis = 0, 0, 0, [], [], set()
            t0 = time.perf_counter()
            for _ in range(a.trials):
                t = diff(*make(slower, a.turns, a.calls, inter)).row("spin").significance
                basis.add(t.basis)
                flags += t.significant
                up += t.direction > 0
                down += t.direction < 0
                est.append(t.estimate)
                lo, hi = t.interval
                width.append(hi - lo)
            dt = (time.perf_counter() - t0) / a.trials
            label = "identical" if slower == 1.0 else f"{slower - 1:.0%} slower"
            print(f"{name:<8} {label:<12} {flags:>4}/{a.trials:<3} {up:>7} {down:>7} "
                  f"{statistics.median(est):>+10.1%} {statistics.median(width):>12.1%} "
                  f"{','.join(sorted(basis)):>8} {dt:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
