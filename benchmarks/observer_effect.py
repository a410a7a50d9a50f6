"""The observer effect: does watching a stage change where the host's preemptions land?

    python benchmarks/observer_effect.py [--rounds 3] [--calls 2000] [--core 0] [--json runs.json] [--append]
    python benchmarks/observer_effect.py --from runs.json [--append]

A CPU hog and a loop pinned to the same core: each turn of the loop does ~100 µs of fixed Python work inside a
stage, then ~900 µs outside any stage (the amounts measured once, the same in every child). Each configuration
runs in a child process of its own (the hot path's options and the probe cannot be switched cleanly in one
process), in rounds, the order shuffled each round, so the configurations see the same machine:

    bare                  no instrument imported: the stage's share is timed by the loop itself (perf_counter)
    timing only           counters="none", cpu_clock=False, the machine probe on
    timing only, no probe the same, machine_probe=False
    default               the default configuration
    every call read       overhead_budget=None

Per configuration, medians over rounds: the stage's share of the loop's wall (stage wall total / loop wall) and
its ratio to timing only's and to bare's; the stage's mean wall per call; the run-queue share of the stage (the
snapshot's wall split) and its verdict; the loop's involuntary context switches (getrusage RUSAGE_THREAD
ru_nivcsw) and the loop's wall against bare; the CPU a read call costs the thread measured from outside (in the
every-call-read child after its loop: 60 pairs of 10-turn blocks of the same loop, the stage read on every call and
timed only, the configuration switched between them; the median difference of thread CPU per turn) beside
meta.overhead.per_read_ns; the probe's CPU (meta.overhead.probe_cpu_ns) as a share of the loop's wall.
Prints a markdown table; --append adds it to benchmarks/RESULTS.md as a dated section.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = {   # name: configure() options, None: instrument is not imported
    "bare": None,
    "timing only": {"counters": "none", "cpu_clock": False, "machine_probe": True},
    "timing only, no probe": {"counters": "none", "cpu_clock": False, "machine_probe": False},
    "default": {},
    "every call read": {"overhead_budget": None},
}
BASIS = "timing only"

CHILD = r"""
import json, os, resource, sys, time
core, calls, inner, outer = (int(a) for a in sys.argv[1:5])
opts = json.loads(sys.argv[5])
os.sched_setaffinity(0, {core})

def work(n):
    x = 0
    for i in range(n):
        x += i * i
    return x

if opts is not None:
    import instrument
    instrument.configure(**opts)
    st = instrument.stage("inner")
work(inner + outer)   # warm
if opts is not None:
    instrument.reset()
own = 0
u0, c0, w0 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time_ns(), time.perf_counter_ns()
if opts is None:
    for _ in range(calls):
        t = time.perf_counter_ns()
        work(inner)
        own += time.perf_counter_ns() - t
        work(outer)
else:
    for _ in range(calls):
        with st:
            work(inner)
        work(outer)
w1, c1, u1 = time.perf_counter_ns(), time.thread_time_ns(), resource.getrusage(resource.RUSAGE_THREAD)
out = {"wall": w1 - w0, "cpu": c1 - c0, "ivcsw": u1.ru_nivcsw - u0.ru_nivcsw, "load": os.getloadavg()[0]}
if opts is None:
    out.update(stage=own, calls=calls)
else:
    snap = instrument.snapshot()
    s = snap["inner"]
    rq = s.split_part("runqueue")
    ov = snap.meta.get("overhead") or {}
    out.update(stage=s.wall_total, calls=s.calls, runqueue=None if rq is None else rq / s.wall_total,
               verdict=(s.verdict or {}).get("verdict"), per_read_ns=ov.get("per_read_ns"),
               read_calls=ov.get("read_calls"), probe_cpu_ns=ov.get("probe_cpu_ns"))
if opts is not None and opts.get("overhead_budget", 0) is None:
    # what a read call costs this thread, from outside: blocks of calls read on every call against the same calls
    # timed only, alternated (the configuration switched between them), thread CPU per call, paired differences
    import statistics, warnings
    warnings.simplefilter("ignore")   # counters named again below: unavailable ones would be warned about
    full = {k: v for k, v in instrument.configure().to_dict().items() if k in ("counters", "cpu_clock")}
    diffs = []
    for _ in range(60):   # the loop's own turns (the work outside the stage too: the caches the reads meet)
        per = []
        for o in (dict(full, overhead_budget=None), dict(counters="none", cpu_clock=False)):
            instrument.configure(**o)
            c = time.thread_time_ns()
            for _ in range(10):
                with st:
                    work(inner)
                work(outer)
            per.append((time.thread_time_ns() - c) / 10)
        diffs.append(per[0] - per[1])
    out["read_cpu_ns"] = statistics.median(diffs)
print(json.dumps(out))
"""


def iterations_for(us: float) -> int:
    """Turns of the child's work loop that take about `us` µs of CPU here (the fastest of a few timings)."""
    code = ("import time\ndef work(n):\n    x = 0\n    for i in range(n):\n        x += i * i\n    return x\n"
            "best = min((lambda c: (work(20000), time.thread_time_ns() - c)[1])(time.thread_time_ns()) "
            "for _ in range(30))\nprint(best / 20000)")
    per = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    return max(1, round(us * 1000 / per))


def run_child(core: int, calls: int, inner: int, outer: int, opts) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(core), str(calls), str(inner), str(outer), json.dumps(opts)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.splitlines()[-1])


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def measure(rounds: int, calls: int, core: int) -> dict:
    inner, outer = iterations_for(100), iterations_for(900)
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    runs = {name: [] for name in CONFIGS}
    start = time.time()
    try:
        time.sleep(0.5)
        for _ in range(rounds):
            order = list(CONFIGS)
            random.shuffle(order)
            for name in order:
                runs[name].append(run_child(core, calls, inner, outer, CONFIGS[name]))
    finally:
        hog.kill()
        hog.wait()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout
    return {"runs": runs, "inner": inner, "outer": outer, "rounds": rounds, "calls": calls, "commit": commit.strip(),
            "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "seconds": round(time.time() - start)}


def summarize(m: dict) -> list:
    runs = m["runs"]
    share = {n: med(r["stage"] / r["wall"] for r in rs) for n, rs in runs.items()}
    wall = {n: med(r["wall"] for r in rs) for n, rs in runs.items()}
    ivcsw = {n: med(r["ivcsw"] for r in rs) for n, rs in runs.items()}
    rows = []
    for n, rs in runs.items():
        reads = med(r.get("read_calls") for r in rs)
        read_cost = med(r.get("read_cpu_ns") for r in rs)
        probe = med(r["probe_cpu_ns"] / r["wall"] for r in rs if r.get("probe_cpu_ns") is not None)
        rows.append({
            "configuration": n, "share": share[n], "share_vs_timing": share[n] / share[BASIS],
            "share_vs_bare": share[n] / share["bare"], "mean_wall_us": med(r["stage"] / r["calls"] / 1e3 for r in rs),
            "runqueue_share": med(r.get("runqueue") for r in rs),
            "verdicts": sorted({r.get("verdict") for r in rs if r.get("verdict")}),
            "ivcsw": ivcsw[n], "ivcsw_vs_bare": ivcsw[n] / ivcsw["bare"] if ivcsw["bare"] else None,
            "wall_ms": wall[n] / 1e6, "wall_vs_bare": wall[n] / wall["bare"],
            "read_cpu_us": None if read_cost is None else read_cost / 1e3,
            "per_read_us": (lambda v: None if v is None else v / 1e3)(med(r.get("per_read_ns") for r in rs)),
            "read_calls": reads, "probe_share": probe,
            "load": [round(min(r["load"] for r in rs), 2), round(max(r["load"] for r in rs), 2)]})
    return rows


def fmt(x, spec, dash="–"):
    return dash if x is None else format(x, spec)


def table(rows: list) -> str:
    head = ("| configuration | stage share of loop | vs timing only | vs bare | stage mean wall µs | run-queue share "
            "of stage | verdict | loop ivcsw | vs bare | loop wall ms | vs bare | read call's CPU µs (outside) | "
            "per_read_ns µs | read calls | probe CPU share | load |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    lines = [head]
    for r in rows:
        lines.append(" | ".join([
            f"| {r['configuration']}", fmt(r["share"], ".3f"), fmt(r["share_vs_timing"], ".2f"),
            fmt(r["share_vs_bare"], ".2f"), fmt(r["mean_wall_us"], ",.0f"), fmt(r["runqueue_share"], ".2f"),
            ", ".join(r["verdicts"]) or "–", fmt(r["ivcsw"], ",.0f"), fmt(r["ivcsw_vs_bare"], ".2f"),
            fmt(r["wall_ms"], ",.0f"), fmt(r["wall_vs_bare"], ".3f"), fmt(r["read_cpu_us"], ".1f"),
            fmt(r["per_read_us"], ".1f"), fmt(r["read_calls"], ",.0f"),
            "–" if r["probe_share"] is None else f"{100 * r['probe_share']:.3f} %",
            f"{r['load'][0]}–{r['load'][1]} |"]))
    return "\n".join(lines)


def section(m: dict, text: str) -> str:
    return (f"\n## Observer effect beside a hog on the same core ({m['date']} UTC, "
            f"`python benchmarks/observer_effect.py --rounds {m['rounds']} --calls {m['calls']}`)\n\n"
            f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, commit {m['commit']}; "
            f"{m['seconds']} s in all. A loop and a CPU hog pinned to one core; {m['calls']:,} turns of {m['inner']:,} "
            f"iterations of a Python loop inside the stage (~100 µs) and {m['outer']:,} outside (~900 µs); each "
            f"configuration a child process, {m['rounds']} rounds in shuffled order, medians over rounds. `read call's "
            f"CPU µs (outside)`: thread CPU per turn of 10-turn blocks of the loop, the stage read on every call, less that "
            f"of the same blocks timed only (60 pairs alternated in one process, median); `per_read_ns`: what the snapshot states "
            f"(meta.overhead); `probe CPU share`: meta.overhead.probe_cpu_ns over the loop's wall.\n\n{text}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--core", type=int, default=min(os.sched_getaffinity(0)))
    ap.add_argument("--append", action="store_true", help="add the table to benchmarks/RESULTS.md")
    ap.add_argument("--json", help="write the raw runs here")
    ap.add_argument("--from", dest="src", help="no measuring: the table of runs written earlier by --json")
    a = ap.parse_args(argv)
    if a.src:
        with open(a.src) as f:
            m = json.load(f)
    else:
        m = measure(a.rounds, a.calls, a.core)
    rows = summarize(m)
    text = table(rows)
    print(text)
    if a.json and not a.src:
        with open(a.json, "w") as f:
            json.dump({**m, "rows": rows}, f, indent=1)
    if a.append:
        with open(os.path.join(HERE, "RESULTS.md"), "a") as f:
            f.write(section(m, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
