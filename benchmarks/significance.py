"""How often does `instrument diff` call identical code changed, and how often does it see a real change?

A small service (`request` holding `tokenize`: a pure-Python loop with 8 tokens added per call,
`model`: a pure-Python loop, `alloc`: 16 fresh pages touched per call) is compared with itself and
with versions whose `model` does 10 % and 30 % more iterations, on each design a user can record:

- plain:     two plain runs, one process after the other, each a snapshot of SECONDS of calls;
- plain-hog: the same, with a CPU hog per core running through one of the two runs (before in
             even trials, after in odd ones): the machines differ;
- runs:      RUNS plain runs a side, all of one side then all of the other, each a snapshot,
             merged per side (as a CI job keeps a baseline of several runs): the diff measures
             the spread between runs;
- runs-hog:  the same, with a CPU hog per core through every run of one side;
- turns:     one process, the two versions taking turns in chunks (each chunk a snapshot, merged
             per side), the first of each turn alternating, as `instrument demo` runs its variants;
- windows:   the same chunks, all of one side before all of the other.

    python benchmarks/significance.py [--trials 20] [--seconds 30] [--runs 5] [--turns 20] [--calls 20]
                                      [--cases plain,plain-hog,runs,runs-hog,turns,windows]
                                      [--slowdowns 1.0,1.1,1.3] [--basis turns|windows|runs]
                                      [--keep DIR] [--gate PCT]

Every call is read (overhead_budget none, as docs/cli.md's CI recipe records).  Each pair is judged
twice: as it is, and with `tokenize` (unchanged) as the reference stage whose change of time is
taken as the machine's (`--reference`).  Prints per case and slowdown: the trials in which `model`
was judged slower and in which any other stage was judged changed (false alarms), the basis, the
median estimate and interval width of model's CPU time per call, the tests (m of Bonferroni), the
trials whose machines differed, the load average, and the CI gate at `--gate PCT` (default 10):
the trials it flagged (exit 1), found inconclusive (exit 3: a judged figure could not have shown
PCT) and passed (exit 0), with the median smallest rise its tests flag (`detectable`): model's CPU
time per call, and the largest over every judged figure (what decides conclusive or not).  (Both sides' iteration counts are made
the same way, `int(base * factor)`: a loop bound that is a literal constant ran 2-3 % slower here
than one computed by int(), a real difference the turns found.)
"""
import argparse
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import instrument  # noqa: E402
from instrument.analysis.diff import REGRESSIONS, diff  # noqa: E402

PAGE = mmap.PAGESIZE


def service(slower: float, calls: int = 0, seconds: float = 0.0) -> None:
    """`calls` requests, or as many as fit in `seconds`."""
    req, tok, model, alloc = (instrument.stage(n) for n in ("request", "tokenize", "model", "alloc"))
    tok_it, model_it = int(300 * 1.0), int(2000 * slower)
    end = time.perf_counter() + seconds
    k = 0
    while (k < calls) if calls else (time.perf_counter() < end):
        k += 1
        with req:
            with tok:
                x = 0
                for i in range(tok_it):
                    x += i * i
                instrument.add("tokens", 8)
            with model:
                x = 0
                for i in range(model_it):
                    x += i * i
            with alloc:
                buf = mmap.mmap(-1, 16 * PAGE)
                for j in range(0, 16 * PAGE, PAGE):
                    buf[j] = 1
                buf.close()


def worker(out: str, slower: float, seconds: float) -> None:
    instrument.configure(overhead_budget=None)   # every call read: CPU time exact, as the CI recipe records
    service(slower, seconds=seconds)
    instrument.snapshot().save(out)


def hogs() -> list:
    cores = sorted(os.sched_getaffinity(0))
    code = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code, str(c)]) for c in cores]


def plain_run(path: str, slower: float, seconds: float, hog: bool) -> instrument.Snapshot:
    started = hogs() if hog else []
    try:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", path, str(slower), str(seconds)],
                       check=True)
    finally:
        for h in started:
            h.kill()
            h.wait()
    return instrument.Snapshot.load(path)


def hogged(trial: int, a) -> tuple:
    """Which side runs beside the hogs: before in even trials, after in odd ones (neither without a.hog)."""
    return (trial % 2 == 0, trial % 2 == 1) if a.hog else (False, False)


def plain(slower: float, trial: int, a) -> tuple:
    with tempfile.TemporaryDirectory() as d:
        hog = hogged(trial, a)
        return (plain_run(os.path.join(d, "before.json"), 1.0, a.seconds, hog[0]),
                plain_run(os.path.join(d, "after.json"), slower, a.seconds, hog[1]))


def runs(slower: float, trial: int, a) -> tuple:
    with tempfile.TemporaryDirectory() as d:
        hog = hogged(trial, a)
        sides = []
        for side, factor in enumerate((1.0, slower)):
            snaps = [plain_run(os.path.join(d, f"{side}-{k}.json"), factor, a.seconds, hog[side])
                     for k in range(a.runs)]
            sides.append(snaps[0].merge(*snaps[1:]))
        return tuple(sides)


def chunks(slower: float, trial: int, a, interleave: bool) -> tuple:
    order = [side for k in range(a.turns) for side in ((0, 1) if k % 2 == 0 else (1, 0))]   # ABBA
    if not interleave:
        order.sort()
    parts = ([], [])
    for side in order:
        instrument.reset()
        service((1.0, slower)[side], calls=a.calls)
        parts[side].append(instrument.snapshot())
    return parts[0][0].merge(*parts[0][1:]), parts[1][0].merge(*parts[1][1:])


CASES = {"plain": lambda s, t, a: plain(s, t, a), "plain-hog": lambda s, t, a: plain(s, t, a),
         "runs": runs, "runs-hog": runs,
         "turns": lambda s, t, a: chunks(s, t, a, True), "windows": lambda s, t, a: chunks(s, t, a, False)}


class Cell:
    """Counts over the trials of one case, slowdown and way of judging."""

    def __init__(self) -> None:
        self.slow = self.others = self.differed = 0
        self.est, self.width, self.bases, self.tests, self.alarms = [], [], set(), [], []
        self.gate = {"flagged": 0, "inconclusive": 0, "passed": 0}
        self.model_detectable, self.gate_detectable = [], []

    def add(self, d, slower: float, pct: float) -> None:
        row = d.row("request/model")
        judged = [t.detectable for r in d.rows for k, t in r.judged if k in REGRESSIONS and t.detectable]
        outcome = "flagged" if d.regressions(pct) else "inconclusive" if d.blind(pct) or not judged else "passed"
        self.gate[outcome] += 1
        self.gate_detectable.append(max(judged, default=float("nan")))
        self.slow += row.judgement == "slower"
        changed = {("request",), ("request", "model")} if slower != 1.0 else set()   # model and its parent
        alarms = [f"{'/'.join(r.path)} {figure} {t.estimate:+.1%}" for r in d.rows if r.path not in changed
                  and r.significant for figure, t in [r.decision]]   # what the row was judged on
        self.others += bool(alarms)
        self.alarms += alarms
        self.differed += d.machine.differed
        self.bases.add(d.basis)
        self.tests.append(d.tests)
        cpu = row.tests.get("cpu")
        if cpu is not None and cpu.estimate is not None:
            self.est.append(cpu.estimate)
            self.width.append(cpu.interval[1] - cpu.interval[0])
            self.model_detectable.append(cpu.detectable)

    def line(self, case: str, slower: float, trials: int, load0: float, seconds: float) -> str:
        label = "identical" if slower == 1.0 else f"{slower - 1:.0%} slower"
        return (f"{case:<15} {label:<12} {self.slow:>6}/{trials:<5} {self.others:>7} {','.join(sorted(self.bases)):>8} "
                f"{statistics.median(self.est) if self.est else float('nan'):>+11.1%} "
                f"{statistics.median(self.width) if self.width else float('nan'):>7.0%} "
                f"{statistics.median(self.tests):>6.0f} {self.differed:>10}/{trials:<6} "
                f"{load0:>4.1f}-{os.getloadavg()[0]:<4.1f} {seconds:>8.1f} "
                f"{self.gate['flagged']:>4}/{self.gate['inconclusive']}/{self.gate['passed']:<4} "
                f"{_median(self.model_detectable):>+9.1%} {_median(self.gate_detectable):>+9.1%}")


def _median(xs: list) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seconds", type=float, default=30.0, help="length of each plain run")
    p.add_argument("--runs", type=int, default=5, help="plain runs a side for runs and runs-hog")
    p.add_argument("--turns", type=int, default=20, help="chunks a side for turns and windows")
    p.add_argument("--calls", type=int, default=20, help="requests per chunk")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--slowdowns", default="1.0,1.1,1.3")
    p.add_argument("--basis", choices=("turns", "windows", "runs"), help="the basis asked of the diff (default: "
                   "the strongest the snapshots allow)")
    p.add_argument("--keep", metavar="DIR", help="save each trial's two snapshots there")
    p.add_argument("--gate", type=float, default=10.0, metavar="PCT", help="the gate's threshold, as "
                   "--fail-on-regression PCT (default 10)")
    a = p.parse_args()
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
    instrument.configure(overhead_budget=None)
    service(1.0, calls=2000)   # warm
    print(f"{a.trials} trials per cell; plain runs of {a.seconds:g} s, {a.runs} a side for runs; turns and windows: "
          f"{a.turns} chunks x {a.calls} requests a side; every call read (overhead_budget none); alpha 0.01 over "
          f"all tests, min_change 3 %; gate at {a.gate:g} %; load {os.getloadavg()[0]:.1f}")
    print(f"{'case':<15} {'model':<12} {'model slower':>12} {'others':>7} {'basis':>8} {'CPU/call est':>12} "
          f"{'width':>8} {'tests':>6} {'machines differed':>17} {'load':>10} {'s/trial':>8} "
          f"{'gate 1/3/0':>10} {'detectable':>9} {'gate det.':>9}", flush=True)
    for case in a.cases.split(","):
        a.hog = case.endswith("-hog")
        for slower in (float(x) for x in a.slowdowns.split(",")):
            plain_cell, ref_cell = Cell(), Cell()
            load0, t0 = os.getloadavg()[0], time.perf_counter()
            for trial in range(a.trials):
                sides = CASES[case](slower, trial, a)
                if a.keep:
                    for side, snap in zip(("before", "after"), sides):
                        snap.save(os.path.join(a.keep, f"{case}-{slower}-{trial}-{side}.json"))
                plain_cell.add(diff(*sides, basis=a.basis), slower, a.gate / 100)
                ref_cell.add(diff(*sides, basis=a.basis, reference="request/tokenize"), slower, a.gate / 100)
            seconds = (time.perf_counter() - t0) / a.trials
            print(plain_cell.line(case, slower, a.trials, load0, seconds), flush=True)
            print(ref_cell.line(f"{case} +ref", slower, a.trials, load0, seconds), flush=True)
            for label, cell in ((case, plain_cell), (f"{case} +ref", ref_cell)):
                if cell.alarms:
                    print(f"  {label}, {'identical' if slower == 1.0 else f'{slower - 1:.0%} slower'}: "
                          f"judged changed: {'; '.join(cell.alarms)}", flush=True)


if __name__ == "__main__":
    main()
