"""Scale: many stages, many threads, many files, each figure beside its anchor measured in the same run.

    python benchmarks/scale.py [--stages 1000] [--threads 4] [--files 10] [--rounds 5]

- a read call (every call read) with 0, 15 and 63 other stage threads alive (idle, each having run a stage):
  ns per call and the ratio to 0;
- memory: the process's RSS before and after `--threads` threads each run `--stages` stages once, per
  (thread, stage) pair;
- `snapshot()` at 10, 100 and `--stages` stages on `--threads` threads (verdicts are judged when first read), and
  at `--stages` with every verdict read;
- a saved file: bytes per stage, `Snapshot.load()` against `json.loads` of the same file;
- `merge` of 2 and `--files` files (loaded first) against the loads themselves.
Medians over `--rounds`.
"""
import argparse
import gc
import json
import os
import platform
import statistics
import tempfile
import threading
import time

import instrument
from instrument.snapshot import Snapshot


def median_of(rounds, fn):
    return statistics.median(fn() for _ in range(rounds))


def read_cost(rounds):
    instrument.configure(overhead_budget=None)
    st = instrument.stage("read")

    def cost(n=20_000):
        t = time.thread_time_ns()
        for _ in range(n):
            with st:
                pass
        return (time.thread_time_ns() - t) / n
    stop, ready, out = threading.Event(), [], {}

    def idle():
        with instrument.stage("idle"):
            pass
        ready.append(1)
        stop.wait()
    alive = []
    for n in (0, 15, 63):
        for _ in range(n - len(alive)):
            t = threading.Thread(target=idle)
            t.start()
            alive.append(t)
        while len(ready) < n:
            time.sleep(0.01)
        out[n] = median_of(rounds, cost)
    stop.set()
    for t in alive:
        t.join()
    instrument.configure(overhead_budget=0.01)
    return out


def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def record(n_stages, n_threads):
    stages = [instrument.stage(f"s{i}") for i in range(n_stages)]

    def work():
        with instrument.stage("req"):
            for st in stages:
                with st:
                    pass
    ts = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(f"{platform.platform()}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}; "
          f"backend {instrument.snapshot().meta['backend']['name']}")

    rc = read_cost(a.rounds)
    print("read call, every call read: " + "; ".join(
        f"{n} other stage threads {v:,.0f} ns ({v / rc[0]:.2f}x)" for n, v in rc.items()))

    instrument.reset()
    gc.collect()
    before = rss_kb()
    record(a.stages, a.threads)
    after = rss_kb()
    print(f"memory: {a.stages} stages x {a.threads} threads: +{(after - before) / 1024:.1f} MiB RSS, "
          f"{(after - before) * 1024 / (a.stages * a.threads):,.0f} bytes per (thread, stage)")

    for n in (10, 100, a.stages):
        instrument.reset()
        record(n, a.threads)
        ms = median_of(a.rounds, lambda: (lambda t: (instrument.snapshot(), time.perf_counter() - t)[1])(
            time.perf_counter())) * 1e3
        print(f"snapshot(): {n} stages x {a.threads} threads {ms:.1f} ms")
    judged = median_of(a.rounds, lambda: (lambda t: ([s.verdict and s.verdict["verdict"] for s in instrument.snapshot()],
                                                     time.perf_counter() - t)[1])(time.perf_counter())) * 1e3
    print(f"snapshot() with every verdict read: {a.stages} stages x {a.threads} threads {judged:.1f} ms")

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.json")
        instrument.snapshot().save(path)
        size = os.path.getsize(path)
        raw = open(path).read()
        tj = median_of(a.rounds, lambda: (lambda t: (json.loads(raw), time.perf_counter() - t)[1])(time.perf_counter()))
        tl = median_of(a.rounds, lambda: (lambda t: (Snapshot.load(path), time.perf_counter() - t)[1])(
            time.perf_counter()))
        print(f"file: {size / (a.stages + 1):,.0f} bytes per stage; load() {tl * 1e3:.0f} ms, json.loads "
              f"{tj * 1e3:.0f} ms ({tl / tj:.1f}x)")
        d0 = json.loads(raw)
        files = []
        for k in range(a.files):
            d0["meta"]["pid"] = 10_000 + k
            d0["meta"]["start_time"] += 100
            d0["meta"]["end_time"] += 100
            files.append(os.path.join(d, f"w{k}.json"))
            with open(files[-1], "w") as f:
                json.dump(d0, f)
        for n in (2, a.files):
            t = time.perf_counter()
            snaps = [Snapshot.load(p) for p in files[:n]]
            loads = time.perf_counter() - t
            t = time.perf_counter()
            snaps[0].merge(*snaps[1:])
            merge = time.perf_counter() - t
            print(f"merge of {n} files: the loads {loads:.2f} s, the merge {merge:.2f} s beyond them")


if __name__ == "__main__":
    main()
