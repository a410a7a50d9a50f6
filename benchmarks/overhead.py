"""Cost of one stage enter+exit, side by side with the anchors, in one process.

    python benchmarks/overhead.py [--rounds 15] [--number 100000] [--memory-calls 10000000] [--json out.json]

Every candidate is timed in interleaved rounds (the order shuffled each round),
the figure is the median ns per enter+exit, and the ratios are taken against
anchors measured in the same run, so machine noise affects both sides alike.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import timeit

import instrument
from instrument.live import backend as live_backend, collector as _collector


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PerfCounterTimer:
    """What people write by hand: a Python context manager around perf_counter_ns."""
    __slots__ = ("name", "t0", "total", "calls")

    def __init__(self, name):
        self.name, self.total, self.calls = name, 0, 0

    def __enter__(self):
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc):
        self.total += time.perf_counter_ns() - self.t0
        self.calls += 1
        return False


def candidates():
    """name -> (setup callable returning globals, statement, config to apply)."""
    import nvtx
    out = {}
    nc = contextlib.nullcontext()
    out["nullcontext() inline"] = ({"nullcontext": contextlib.nullcontext}, "with nullcontext(): pass", None)
    out["nullcontext reused"] = ({"nc": nc}, "with nc: pass", None)
    out["nvtx.annotate inline"] = ({"nvtx": nvtx}, "with nvtx.annotate('stage'): pass", None)
    dom = nvtx.get_domain("bench")
    attr = dom.get_event_attributes(message="stage")
    out["nvtx push/pop cached"] = ({"dom": dom, "attr": attr}, "dom.push_range(attr); dom.pop_range()", None)
    t = PerfCounterTimer("stage")
    out["perf_counter_ns timer class"] = ({"t": t}, "with t: pass", None)
    try:
        from torch.profiler import record_function
        out["torch record_function, profiler off"] = ({"rf": record_function}, "with rf('stage'): pass", None)
    except ImportError:
        pass
    timing = dict(enabled=True, counters="none", cpu_clock=False, nvtx=False, trace_events=0)
    s = instrument.stage("bench")
    # what users get: every option at its default (counters, CPU clock, user/system split, NVTX, exemplars, 1 %
    # overhead budget), whatever the environment says
    out["instrument default configuration"] = ({"s": s}, "with s: pass", DEFAULTS)
    out["instrument disabled, reused"] = ({"s": s}, "with s: pass", dict(timing, enabled=False))
    out["instrument timing, reused"] = ({"s": s}, "with s: pass", timing)
    out["instrument timing, inline stage()"] = ({"stage": instrument.stage}, "with stage('bench'): pass", timing)
    out["instrument timing + cpu clock"] = ({"s": s}, "with s: pass", dict(timing, cpu_clock=True))
    out["instrument timing + NVTX, no tool"] = ({"s": s}, "with s: pass", dict(timing, nvtx=True))

    # perf_event: the default software group, beside the floor of two raw read()s of that same group
    from instrument import counters
    from instrument.live import perf_ctypes as _perf_ctypes
    sw = ["task-clock", "page-faults", "context-switches", "cpu-migrations"]
    lead = _perf_ctypes.perf_event_open(*counters.resolve(sw[0])[:2], exclude_kernel=False)
    if lead >= 0:
        for n in sw[1:]:
            _perf_ctypes.perf_event_open(*counters.resolve(n)[:2], group_fd=lead, exclude_kernel=False)
        size = 8 * (3 + 2 * len(sw))
        out["floor: two read()s of the software group"] = (
            {"read": os.read, "fd": lead, "n": size}, "read(fd, n); read(fd, n)", None)
        out["instrument software-group counters, every call"] = (
            {"s": s}, "with s: pass", dict(timing, counters=sw, overhead_budget=None, cpu_split=False))
        import resource
        out["floor: two read()s of the group + two getrusage"] = (
            {"read": os.read, "fd": lead, "n": size, "ru": resource.getrusage, "T": resource.RUSAGE_THREAD},
            "read(fd, n); ru(T); ru(T); read(fd, n)", None)
        out["instrument software group + user/sys, every call"] = (
            {"s": s}, "with s: pass", dict(timing, counters=sw, overhead_budget=None, cpu_split=True))

    def plain():
        pass
    out["plain call, in a reused stage"] = ({"s": s, "f": plain}, "with s: f()", timing)
    out["@region call"] = ({"f": instrument.region("bench")(plain)}, "f()", timing)
    return out


_DEFAULT_NAMES = ("enabled", "counters", "cpu_clock", "cpu_split", "overhead_budget", "nvtx", "trace_events",
                  "exemplars", "max_stages", "task_attribution")
DEFAULTS = {o.name: o.default for o in instrument.config.OPTIONS if o.name in _DEFAULT_NAMES}


def sampled_accuracy(calls: int = 3000, chunks: int = 30) -> dict:
    """A 100 µs stage touching 4 fresh pages per call, under the default budget and read on every call, in
    alternating chunks.  The CPU time of fixed work drifts by 20 % between runs on a shared VM, so each side's
    task-clock is taken against the thread CPU time its own calls' bodies measured (two clock reads inside
    each call), and the two sides' ratios are compared; page faults against the 4 per call touched."""
    import mmap
    page = mmap.PAGESIZE
    work = instrument.stage("accuracy")
    n = 20_000
    t = time.thread_time_ns()
    x = 0
    for i in range(n):
        x += i
    per = max((time.thread_time_ns() - t) / n, 1e-3)
    iters = int(100_000 / per)
    truth = {"sampled": 0, "every call": 0}

    def run(k, side):
        for _ in range(k):
            with work:
                t0 = time.thread_time_ns()
                m = mmap.mmap(-1, 4 * page)
                for j in range(4):
                    m[j * page] = 1
                m.close()
                x = 0
                for i in range(iters):
                    x += i
                truth[side] += time.thread_time_ns() - t0
    sums = {side: {"task-clock": 0.0, "page-faults": 0.0, "reads": 0, "calls": 0} for side in truth}
    base = _collector.current_config().values
    for c in range(2 * chunks):
        side = ("sampled", "every call")[(c + c // 2) % 2]   # neither side always first
        instrument.configure(**dict(DEFAULTS, nvtx=False, overhead_budget=0.01 if side == "sampled" else None))
        instrument.reset()
        run(calls // chunks, side)
        s = instrument.snapshot()["accuracy"]
        d = sums[side]
        for k in ("task-clock", "page-faults"):
            d[k] += s.counter(k)
        d["reads"] += s.counters["task-clock"]["read_calls"]
        d["calls"] += s.calls
    instrument.configure(**base)
    out = {side: {"task-clock_per_body_cpu": d["task-clock"] / truth[side],
                  "page-faults_per_call": d["page-faults"] / d["calls"], "read_calls": d["reads"],
                  "calls": d["calls"]} for side, d in sums.items()}
    out["ratio"] = {k: out["sampled"][f] / out["every call"][f]
                    for k, f in (("task-clock", "task-clock_per_body_cpu"), ("page-faults", "page-faults_per_call"))}
    return out


def measure(rounds: int, number: int):
    cands = candidates()
    base_cfg = _collector.current_config().values
    timers = {k: (timeit.Timer(stmt, globals=dict(g)), cfg) for k, (g, stmt, cfg) in cands.items()}
    samples = {k: [] for k in cands}
    loop = timeit.Timer("pass").timeit(number) / number
    for _ in range(rounds):
        order = list(timers)
        random.shuffle(order)
        for k in order:
            tm, cfg = timers[k]
            instrument.configure(**(cfg or base_cfg))
            instrument.reset()
            gc.disable()
            try:
                samples[k].append((tm.timeit(number) / number - loop) * 1e9)
            finally:
                gc.enable()
    instrument.configure(**base_cfg)
    return {k: statistics.median(v) for k, v in samples.items()}


def headline(rounds: int, number: int) -> dict:
    """The default configuration against timing only, for an empty reused stage: each round times the two back
    to back (in a shuffled order); the figure is the median of the rounds' ratios, with the load average."""
    base_cfg = _collector.current_config().values
    timing = dict(enabled=True, counters="none", cpu_clock=False, nvtx=False, trace_events=0)
    s = instrument.stage("bench")
    tm = timeit.Timer("with s: pass", globals={"s": s})
    loop = timeit.Timer("pass").timeit(number) / number
    ratios, ns, load = [], {"default": [], "timing": []}, []
    for _ in range(rounds):
        got = {}
        for k in random.sample(["default", "timing"], 2):
            instrument.configure(**(DEFAULTS if k == "default" else timing))
            instrument.reset()
            gc.disable()
            try:
                got[k] = (tm.timeit(number) / number - loop) * 1e9
            finally:
                gc.enable()
            ns[k].append(got[k])
        ratios.append(got["default"] / got["timing"])
        load.append(os.getloadavg()[0])
    instrument.configure(**base_cfg)
    return {"asyncio_imported": "asyncio" in sys.modules, "rounds": rounds, "ratio": statistics.median(ratios),
            "ratios": ratios, "default_ns": statistics.median(ns["default"]),
            "timing_ns": statistics.median(ns["timing"]), "loadavg": statistics.median(load)}


def headline_with_asyncio(rounds: int, number: int) -> dict:
    """headline() in a fresh process that imports asyncio first (the SDK then watches task switches)."""
    import subprocess
    code = (f"import asyncio, json, sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import overhead; print(json.dumps(overhead.headline({rounds}, {number})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-300:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def print_headline(h: dict) -> None:
    if "error" in h:
        print(f"  headline failed: {h['error']}")
        return
    print(f"  default / timing only, empty stage, asyncio {'imported' if h['asyncio_imported'] else 'not imported'}: "
          f"{h['ratio']:.2f} (median of {h['rounds']} rounds; {h['default_ns']:.0f} vs {h['timing_ns']:.0f} ns; "
          f"load average {h['loadavg']:.2f}; target <= 1.25: {'met' if h['ratio'] <= 1.25 else 'NOT met'})")


def memory(calls: int) -> dict:
    instrument.configure(counters="none", nvtx=False, cpu_clock=False, trace_events=0)
    s = instrument.stage("memory")
    for _ in range(100000):
        with s:
            pass
    gc.collect()
    before = rss_bytes()
    for _ in range(calls):
        with s:
            pass
    gc.collect()
    after = rss_bytes()
    return {"calls": calls, "rss_before": before, "rss_after": after, "delta_bytes": after - before}


def torch_overhead(rounds: int, number: int) -> dict:
    """One reused stage with torch not yet imported, imported with no profiler (no hooks: must match),
    under a recording torch profiler (one range per stage), and with GPU events (only where CUDA is)."""
    base_cfg = _collector.current_config().values
    instrument.configure(enabled=True, counters="none", cpu_clock=False, nvtx=False, trace_events=0)
    tm = timeit.Timer("with s: pass", globals={"s": instrument.stage("bench")})
    loop = timeit.Timer("pass").timeit(number) / number

    def run(n=number, k=rounds):
        gc.disable()
        try:
            return statistics.median((tm.timeit(n) / n - loop) * 1e9 for _ in range(k))
        finally:
            gc.enable()
    out = {}
    if "torch" not in sys.modules:
        out["stage, torch not imported"] = run()
    try:
        import torch
    except ImportError:
        instrument.configure(**base_cfg)
        return out
    out["stage, torch imported, no profiler"] = run()
    from instrument.live import torch_profiler
    rf = timeit.Timer("with rf('bench'): pass", globals={"rf": torch.profiler.record_function})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        n, k = max(number // 50, 100), max(min(rounds, 5), 3)
        stage_ns, rf_ns = [], []
        for i in range(k):   # interleaved, the order alternating: both see the same load and the same event buffer
            pair = [lambda: stage_ns.append(run(n, 1)), lambda: rf_ns.append((rf.timeit(n) / n - loop) * 1e9)]
            for f in pair if i % 2 == 0 else pair[::-1]:
                f()
        out["stage, torch profiler recording"] = statistics.median(stage_ns)
        out["record_function, profiler recording"] = statistics.median(rf_ns)
        out["stage range mechanism"] = torch_profiler.status()["range"]
    out["ratio: stage / record_function, profiler recording"] = (out["stage, torch profiler recording"]
                                                                 / out["record_function, profiler recording"])
    if torch.cuda.is_available():
        torch.cuda.init()
        instrument.configure(gpu="on")
        out["stage, GPU events on"] = run(n=max(number // 10, 100))
        torch.cuda.synchronize()
    instrument.configure(**base_cfg)
    return out


RATIOS = [
    ("instrument default configuration", "instrument timing, reused", 1.25),
    ("instrument default configuration", "nvtx.annotate inline", 0.75),
    ("instrument timing, reused", "nvtx.annotate inline", 0.5),
    ("instrument timing, inline stage()", "nvtx.annotate inline", 0.5),
    ("instrument timing + NVTX, no tool", "nvtx.annotate inline", 0.5),
    ("instrument disabled, reused", "nullcontext reused", 0.5),
    ("instrument software-group counters, every call", "floor: two read()s of the software group", 1.25),
    ("instrument software group + user/sys, every call", "floor: two read()s of the group + two getrusage", 1.25),
    ("@region call", "plain call, in a reused stage", 1.2),
]


PERF_STAT_CHILD = """
import mmap, instrument
instrument.configure(counters=["task-clock", "page-faults"])
with instrument.stage("work"):
    m = mmap.mmap(-1, 20000 * 4096)
    for i in range(20000):
        m[i * 4096] = 1
    x = sum(i * i for i in range(10_000_000))
s = instrument.snapshot().get("work")
print(s.counter("task-clock") if s else 0, s.counter("page-faults") if s else 0)
"""


def perf_stat_comparison() -> dict:
    """The same workload's stage counts beside `perf stat` of the whole process
    (which also counts interpreter start-up, so its totals are the upper bound)."""
    import shutil
    import subprocess
    if not shutil.which("perf"):
        return {"skipped": "perf not on PATH"}
    def stat(code):
        r = subprocess.run(["perf", "stat", "-x,", "-e", "task-clock,page-faults", sys.executable, "-c", code],
                           capture_output=True, text=True)
        got = {}
        for line in r.stderr.splitlines():
            parts = line.split(",")
            if len(parts) > 3 and parts[2] in ("task-clock", "page-faults"):
                got[parts[2]] = float(parts[0]) * (1e6 if parts[2] == "task-clock" else 1)   # msec -> ns
        return r.stdout.split(), got

    runs = [stat(PERF_STAT_CHILD) for _ in range(5)]
    bases = [stat(PERF_STAT_CHILD.replace('with instrument.stage("work"):', 'if False:'))[1] for _ in range(5)]
    med = statistics.median
    stage_tc = med(float(o[0]) for o, _ in runs)
    stage_pf = med(float(o[1]) for o, _ in runs)
    whole = {k: med(g[k] for _, g in runs) for k in ("task-clock", "page-faults")}
    empty = {k: med(b[k] for b in bases) for k in ("task-clock", "page-faults")}
    return {"stage": {"task-clock": stage_tc, "page-faults": stage_pf}, "perf_stat_whole": whole,
            "perf_stat_without_work": empty,
            "ratio": {k: stage / (whole[k] - empty[k]) for k, stage in (("task-clock", stage_tc), ("page-faults", stage_pf))
                      if k in whole and k in empty and whole[k] > empty[k]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--number", type=int, default=100000)
    ap.add_argument("--memory-calls", type=int, default=10_000_000)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--headline", action="store_true", help="only default / timing only, with and without asyncio")
    a = ap.parse_args(argv)
    heads = [headline(max(a.rounds, 11), a.number) if "asyncio" not in sys.modules else None,
             headline_with_asyncio(max(a.rounds, 11), a.number)]
    heads = [h for h in heads if h]
    print("headline (interleaved pairs):")
    for h in heads:
        print_headline(h)
    if a.headline:
        return 0
    tres = torch_overhead(a.rounds, a.number)   # first: the no-torch figure needs torch not yet imported
    res = measure(a.rounds, a.number)
    print(f"backend: {live_backend.name}; python {platform.python_version()}; {platform.machine()}, "
          f"{os.cpu_count()} cores; median of {a.rounds} rounds x {a.number} enter+exit, loop overhead removed")
    w = max(map(len, res))
    for k, v in res.items():
        print(f"  {k:<{w}}  {v:8.1f} ns")
    print("ratios (target):")
    ratios = []
    for num, den, target in RATIOS:
        if num in res and den in res:
            r = res[num] / res[den]
            ratios.append({"candidate": num, "anchor": den, "ratio": r, "target": target, "met": r <= target})
            print(f"  {num} / {den} = {r:.2f}  (target <= {target}: {'met' if r <= target else 'NOT met'})")
    if tres:
        print("torch integration (median ns per enter+exit):")
        tw = max(w, *map(len, tres))
        for k, v in tres.items():
            if isinstance(v, str):
                print(f"  {k:<{tw}}  {v}")
            elif k.startswith("ratio"):
                print(f"  {k:<{tw}}  {v:8.2f}    (target <= 0.3: {'met' if v <= 0.3 else 'NOT met'})")
            else:
                print(f"  {k:<{tw}}  {v:8.1f} ns")
    acc = sampled_accuracy()
    print(f"sampled vs every call, 100 µs stage touching 4 pages ({acc['sampled']['read_calls']:,} of "
          f"{acc['sampled']['calls']:,} calls read under the 1 % budget): task-clock {acc['ratio']['task-clock']:.3f}, "
          f"page-faults {acc['ratio']['page-faults']:.3f} (target within 2 %)")
    cal = instrument.snapshot().meta.get("overhead") or {}
    print(f"calibration: a stage call {cal.get('per_call_ns')} ns, one call's reads {cal.get('per_read_ns')} ns, "
          f"CPU from {cal.get('cpu_source')}, reads' bias {cal.get('cpu_bias_ns')} ns taken out of each read call")
    mem = memory(a.memory_calls) if a.memory_calls else None
    if mem:
        print(f"memory over {mem['calls']:,} stage calls: RSS {mem['rss_before'] / 2**20:.1f} MiB -> "
              f"{mem['rss_after'] / 2**20:.1f} MiB ({mem['delta_bytes'] / 2**20:+.2f} MiB; target within 1 MiB)")
    ps = perf_stat_comparison()
    if "ratio" in ps:
        for k, v in ps["ratio"].items():
            print(f"perf stat (median of 5): stage {k} = {ps['stage'][k]:,.0f}; whole process minus the same process "
                  f"with the work outside any stage = {ps['perf_stat_whole'][k] - ps['perf_stat_without_work'][k]:,.0f}"
                  f" (ratio {v:.3f})")
    else:
        print("perf stat comparison:", ps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"headline": heads, "ns": res, "torch": tres, "ratios": ratios, "memory": mem, "perf_stat": ps, "sampled": acc,
                       "calibration": cal, "backend": live_backend.name,
                       "date": time.strftime("%Y-%m-%d"), "machine": platform.platform()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
