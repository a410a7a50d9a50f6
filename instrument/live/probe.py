"""The machine probe: the speed of a fixed pure-Python loop, timed on the stages' own threads through the recording.

CPU time per call moves with the machine: on a shared VM the same code's CPU time strays by ±27 % over 0.4 s and
by 7 % from one run to the next (benchmarks/RESULTS.md).  The reference loop timed once at import
(meta.machine.reference_ns) sees a moment of that; the probe sees the machine the way the stages ran on it: after
an outermost stage exits, once it is due, it times ITERATIONS turns of the same loop on that thread's CPU time, and
is due again when its own CPU time is SHARE of the time since (about every 16 ms here).  The snapshot holds the
trimmed mean ns per iteration and its precision (meta.machine.probe); `instrument diff` states the machines'
change of speed by it and claims no change of time within it.  The `machine_probe` option turns it off.

It runs outside every stage, but inside the caller's `with` that closed the outermost one, so it reads the thread's
CPU time the way the hot path does (`thread_cpu_ns`: the thread's task-clock), never with a clock that brings the
scheduler's accounting up to date: such a read preempts a thread whose slice is spent right there, inside the
caller's `with` (beside a CPU hog a 15 ms stage's wall was 0.92-0.97 of the wall around it).  A thread of its own
would keep it off the caller's path but wake beside the stages and take the interpreter lock from them: more
switches on a shared core (benchmarks/RESULTS.md).  Its CPU time is the SDK's own cost (meta.overhead.probe_cpu_ns).
"""
from __future__ import annotations

import math
import random
import time
from typing import Any, Callable, Dict, List, Optional

ITERATIONS = 400      # one timing: about 15 µs of CPU here
SHARE = 0.001         # of the wall time the probe takes at most (a tenth of the default overhead budget)
KEEP = 4096           # timings kept: once a run has more, a uniform sample of them
MIN_TIMINGS = 8       # fewer: no figure (meta.machine.probe is null)
TRIM = 0.1            # of the timings at each end left out of the mean (an interrupt inside one timing)

_timings: List[float] = []
_count = 0
_cpu = 0      # ns of CPU the probe took since the last reset (its own cost)
_rng = random.Random()


def loop(iterations: int) -> int:
    """The reference loop: fixed pure-Python work, the same on every machine."""
    x = 0
    for i in range(iterations):
        x += i * i
    return x


def probe(clock: Callable[[], int] = time.thread_time_ns) -> int:
    """One timing on `clock` (the thread's CPU time in ns), kept; returns the ns until the probe is due again.  The
    backend's probe hook is `hook(backend)`: this on the backend's own thread CPU read."""
    global _count, _cpu
    c0 = clock()
    loop(ITERATIONS)
    cpu = clock() - c0
    if cpu > 0:
        _count += 1
        _cpu += cpu
        if len(_timings) < KEEP:
            _timings.append(cpu / ITERATIONS)
        else:   # reservoir sampling: every timing of the run has the same chance of being kept
            k = _rng.randrange(_count)
            if k < KEEP:
                _timings[k] = cpu / ITERATIONS
    return int(max(cpu, ITERATIONS) / SHARE)


def hook(backend: Any) -> Callable[[], int]:
    """The probe hook for `backend`: one timing on its thread CPU read (the hot path's, which preempts nothing)."""
    clock = backend.thread_cpu_ns
    return lambda: probe(clock)


def cpu_ns() -> int:
    """The CPU time the probe took since the last reset: the SDK's own cost."""
    return _cpu


def reset() -> None:
    """Forget the timings (instrument.reset(): a new window)."""
    global _timings, _count, _cpu
    _timings, _count, _cpu = [], 0, 0


def summary() -> Optional[Dict[str, Any]]:
    """meta.machine.probe: ns per iteration, the 10 % trimmed mean of the timings (a mean, as a stage's CPU time
    per call is: on a machine whose speed switches between modes, such as a core shared with a busy hyperthread
    sibling now and then, it weighs the modes as the stages' calls do, where a median jumps from one to the
    other); se_log, the standard error of its log (from the winsorized variance); the median; how many timings
    were taken and kept; the CPU time they took (the probe's own cost).  None under MIN_TIMINGS."""
    xs = sorted(_timings)
    n = len(xs)
    if n < MIN_TIMINGS:
        return None
    g = int(TRIM * n)
    kept = xs[g:n - g]
    mean = sum(kept) / len(kept)
    wins = [min(max(x, kept[0]), kept[-1]) for x in xs]
    wmean = sum(wins) / n
    var = sum((x - wmean) ** 2 for x in wins) / (n - 1)
    se = math.sqrt(var / n) / (1 - 2 * TRIM)
    return {"ns": round(mean, 3), "se_log": round(se / mean, 5), "median": round(xs[n // 2], 3),
            "timings": _count, "kept": n, "iterations": ITERATIONS, "cpu_ns": _cpu}
