"""What does the spread between windows within each run add to the diff's tests?

The service of benchmarks/significance.py (`request` holding `tokenize`, `model` and `alloc`) runs
RUNS plain runs a side, each a process of its own, `model` made SLOWER on the after side, with a
CPU hog per core through every run of one side (before in even trials, after in odd ones) unless
--quiet.  Each run keeps, besides its whole snapshot, its windows of WINDOW seconds
(`snapshot().since(previous)`).  For each leaf stage's CPU time per call the same two-sided
question (a change beyond ±3 % at alpha 0.01 / 4, the m of the diff of these snapshots) is asked
five ways, and the trials in which each flagged `model` and any other stage are counted:

- runs:            each run's figure, the spread between runs measured (the pooled t-test; the
                   diff's test before each run's level was taken);
- window medians:  each run's figure the median of its windows' (a burst in part of a run
                   weighs one window), the spread between runs measured;
- one run, windows: the first run a side only, its windows as the units (Welch's test with each
                   side's drift between halves, the diff's `windows` basis);
- all windows:     every window of every run a side as a unit (the same test);
- the diff:        instrument.diff of the merged runs as it judges them (each run's figure over
                   the level the stages share in it, the spread pooled over them).

    python benchmarks/windows_within_runs.py [--trials 20] [--runs 3] [--seconds 2] [--window 0.2]
                                             [--slower 1.3] [--quiet]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import instrument  # noqa: E402
from instrument.analysis import significance as S  # noqa: E402
from instrument.analysis.diff import diff  # noqa: E402
import significance as bench  # noqa: E402

LEAVES = ("request/tokenize", "request/model", "request/alloc")
ALPHA = 0.01 / 4          # the diff of these snapshots runs 4 tests (CPU per call of each stage)
FLOOR = 0.03


def worker(out: str, slower: float, seconds: float, window: float) -> None:
    instrument.configure(overhead_budget=None)
    previous, windows = instrument.snapshot(), []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        bench.service(slower, seconds=window)
        now = instrument.snapshot()
        w = now.since(previous)
        previous = now
        windows.append({p: [w[p].cpu_total, w[p].cpu_calls] for p in LEAVES if w.get(p) is not None})
    previous.save(out)
    with open(out + ".windows", "w") as f:
        json.dump(windows, f)


def run(path: str, slower: float, a, hog: bool):
    started = bench.hogs() if hog else []
    try:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", path, str(slower), str(a.seconds),
                        str(a.window)], check=True)
    finally:
        for h in started:
            h.kill()
            h.wait()
    with open(path + ".windows") as f:
        return instrument.Snapshot.load(path), json.load(f)


def pooled(xb, xa) -> bool:
    """The pooled t-test on each run's log figure (the spread between runs measured)."""
    return S.runs_test([(math.exp(x), 0.0) for x in xb], [(math.exp(x), 0.0) for x in xa], ALPHA, FLOOR).significant


def per_window(ws, p):
    return [c / n for c, n in (w[p] for w in ws if p in w) if n and c]


def judge(sides) -> dict:
    """{way: {stage: flagged}} for one trial; sides: [(snapshots, windows per run)] before, after."""
    out = {}
    for p in LEAVES:
        runs = [[math.log(s[p].cpu_total / s[p].cpu_calls) for s in snaps] for snaps, _ in sides]
        meds = [[math.log(statistics.median(per_window(ws, p))) for ws in wss] for _, wss in sides]
        first = [per_window(wss[0], p) for _, wss in sides]
        every = [[x for ws in wss for x in per_window(ws, p)] for _, wss in sides]
        out.setdefault("runs", {})[p] = pooled(*runs)
        out.setdefault("window medians", {})[p] = pooled(*meds)
        out.setdefault("one run, windows", {})[p] = S.log_window_test(*first, alpha=ALPHA, min_change=FLOOR).significant
        out.setdefault("all windows", {})[p] = S.log_window_test(*every, alpha=ALPHA, min_change=FLOOR).significant
    d = diff(sides[0][0][0].merge(*sides[0][0][1:]), sides[1][0][0].merge(*sides[1][0][1:]))
    out["the diff"] = {p: d.row(p).tests["cpu"].significant for p in LEAVES}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--window", type=float, default=0.2)
    p.add_argument("--slower", type=float, default=1.3)
    p.add_argument("--quiet", action="store_true", help="no hog through either side")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker[0], float(a.worker[1]), float(a.worker[2]), float(a.worker[3]))
        return
    tally: dict = {}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        for t in range(a.trials):
            hog = (False, False) if a.quiet else (t % 2 == 0, t % 2 == 1)
            sides = []
            for side, factor in ((0, 1.0), (1, a.slower)):
                got = [run(os.path.join(d, f"{t}-{side}-{k}.json"), factor, a, hog[side]) for k in range(a.runs)]
                sides.append(([s for s, _ in got], [w for _, w in got]))
            for way, flags in judge(sides).items():
                c = tally.setdefault(way, [0, 0])
                c[0] += flags["request/model"]
                c[1] += any(flags[q] for q in LEAVES if q != "request/model")
            print(f"trial {t + 1}/{a.trials}", file=sys.stderr, flush=True)
    print(f"{a.trials} trials; {a.runs} runs a side of {a.seconds:g} s, windows of {a.window:g} s; model "
          f"{100 * (a.slower - 1):+.0f} % on the after side; {'quiet' if a.quiet else 'a hog per core through one side'}"
          f"; load {load0:.1f}-{os.getloadavg()[0]:.1f}")
    print(f"{'way':18s} {'model flagged':>14s} {'others flagged':>15s}")
    for way, (m, o) in tally.items():
        print(f"{way:18s} {m:>11d}/{a.trials} {o:>12d}/{a.trials}")


if __name__ == "__main__":
    main()
