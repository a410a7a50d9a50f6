"""The GIL sampler: what it costs and how close its figure is, side by side with the sampler off.

    python benchmarks/gil_wait.py [--rounds 5] [--calls 40]

Three workloads, each run with `gil_wait` on and off in interleaved rounds (the order alternating):
- four threads of pure-Python stages (GIL contention), each thread in one outer call around its inner calls:
  throughput on/off, and the outer stage's GIL wait against what the threads measured off the CPU around it (wall
  less thread CPU less /proc run-queue time, read without letting go of the GIL, again where a timeslice ended
  among the reads);
- one thread of the same stages (no contention): throughput on/off;
- no stage open for a second: the sampler's CPU time then.
The sampler's own CPU time is read from its thread's CPU clock.  Medians; ratios against the sampler-off run of the
same round.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time

import instrument
from instrument import _native

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from thread_clocks import edge, schedstat, thread_cpu_ns  # noqa: E402  (the tests' truth, read the same way)

def sampler_cpu_ns():
    """The sampler thread's CPU time so far, from its own CPU clock (all of it: reads, wake-ups, idle looks)."""
    tid = _native.gil_status()["tid"]
    return thread_cpu_ns(tid) if tid else 0


def work(n=60_000):
    x = 0
    for i in range(n):
        x += i


def threads_run(n_threads, calls):
    """n_threads threads, each in one call of a stage around `calls` pieces of work (a thread waiting for the GIL
    drops it soon after taking it, wherever its code is: reads around many short calls would hold waits of their
    own): (wall s, the threads' own off-CPU ns around their calls)."""
    offs = []
    st, inner = instrument.stage("py"), instrument.stage("work")

    def worker():
        schedstat()
        w0, c0, r0 = edge()
        with st:
            for _ in range(calls):
                with inner:
                    work()
        w1, c1, r1 = edge()
        offs.append(w1 - w0 - (c1 - c0) - (r1 - r0))
    ts = [threading.Thread(target=worker) for _ in range(n_threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, sum(offs)


def one(on, n_threads, calls):
    instrument.configure(gil_wait=on)
    instrument.reset()
    c0, w0 = sampler_cpu_ns(), time.perf_counter()
    wall, off = threads_run(n_threads, calls)
    cost = (sampler_cpu_ns() - c0) / (time.perf_counter() - w0) / 1e9
    s = instrument.snapshot()["py"]
    return {"wall": wall, "off": off, "gil": s.split_part("gil"), "cost": cost}


def idle(seconds=1.0):
    instrument.configure(gil_wait=True)
    c0, w0 = sampler_cpu_ns(), time.perf_counter()
    time.sleep(seconds)
    return (sampler_cpu_ns() - c0) / (time.perf_counter() - w0) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    instrument.configure(gil_wait=True)
    threads_run(1, 2)   # the sampler starts
    out = {}
    for n in (4, 1):
        ratios, costs, acc = [], [], []
        for r in range(a.rounds):
            pair = {}
            for on in ((True, False) if r % 2 else (False, True)):
                pair[on] = one(on, n, a.calls)
            ratios.append(pair[False]["wall"] / pair[True]["wall"])
            costs.append(pair[True]["cost"])
            if pair[True]["off"] > 0.05 * pair[True]["wall"] * 1e9 * n:
                acc.append(pair[True]["gil"] / pair[True]["off"])
        out[f"{n}_threads"] = {"throughput_on_over_off": statistics.median(ratios),
                               "sampler_cpu_share": statistics.median(costs),
                               "gil_over_threads_own_off": statistics.median(acc) if acc else None,
                               "rounds": a.rounds}
    out["idle_sampler_cpu_share"] = statistics.median(idle() for _ in range(3))
    out["status"] = _native.gil_status()
    out["machine"] = f"{platform.platform()}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}"
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(out["machine"])
    for n in (4, 1):
        d = out[f"{n}_threads"]
        acc = d["gil_over_threads_own_off"]
        print(f"{n} thread(s): throughput with the sampler / without {d['throughput_on_over_off']:.3f}; its CPU "
              f"{100 * d['sampler_cpu_share']:.3f} % of one core" +
              (f"; GIL wait / the threads' own off-CPU time {acc:.3f}" if acc is not None else ""))
    print(f"no stage open: its CPU {100 * out['idle_sampler_cpu_share']:.4f} % of one core")


if __name__ == "__main__":
    main()
