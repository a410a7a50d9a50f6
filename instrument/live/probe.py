"""The machine probe: the speed of a fixed pure-Python loop, timed on a thread of its own while the stages run.

CPU time per call moves with the machine: on a shared VM the same code's CPU time strays by ±27 % over 0.4 s and
by 7 % from one run to the next (benchmarks/RESULTS.md).  The reference loop timed once at import
(meta.machine.reference_ns) sees a moment of that; the probe sees the machine through the run: a daemon thread of
its own times ITERATIONS turns of the same loop on its CPU clock (after WARM untimed turns), and sleeps until its
whole turn's CPU time (its wake, the interpreter lock, the loop) is SHARE of the time since: every 20-45 ms here.
It times only while stages run: the C core's probe hook, called after an outermost stage exit once due, marks
them as running (two stores, no system call); a probe thread that finds no mark since its last timing parks until
the hook wakes it, so an idle program is not woken.

The timing is taken on the probe's thread, not on the stages' threads.  Before, it ran on the stage's thread
after its outermost exit: its CPU-clock reads brought that thread's scheduler accounting up to date and had it
preempted inside the caller's `with` (beside a CPU hog a 15 ms stage's wall was 0.92-0.98 of the wall around it).
Its sleeps now wake it at moments unrelated to the stages, so what it takes from them (the interpreter lock for
some tens of µs, a context switch) falls inside and outside stages as their share of the time does.  The same loop
times about 11 % slower on it than run over and over on a stage's thread (benchmarks/RESULTS.md); a diff compares
two runs timed the same way.  The thread starts at the first due exit, again in a forked child, and stops at exit;
it never holds up the program's end.

The snapshot holds the trimmed mean ns per iteration and its precision (meta.machine.probe); `instrument diff`
states the machines' change of speed by it and claims no change of time within it; meta.overhead.probe_cpu_ns is
the probe thread's CPU time in the window (it runs no stage: a stage's helper-thread CPU, the process's less the
stages' threads', holds the turns that fell inside it).  The `machine_probe` option turns it off.
"""
from __future__ import annotations

import _thread
import atexit
import math
import random
import threading
import time
from typing import Any, Dict, List, Optional

ITERATIONS = 400      # one timing: about 15-35 µs of CPU here
WARM = ITERATIONS // 8   # untimed turns first: after its sleep the loop's first turns run up to 50 % slower
SHARE = 0.003         # of the wall time the probe thread's CPU takes at most (its whole turns: the timing itself is
                      # about a third, the interpreter lock taken from the stages' thread that long)
KEEP = 4096           # timings kept: once a run has more, a uniform sample of them
MIN_TIMINGS = 8       # fewer: no figure (meta.machine.probe is null)
TRIM = 0.1            # of the timings at each end left out of the mean (an interrupt inside one timing)

_lock = threading.Lock()   # the timings: the probe thread adds, snapshot() and reset() on other threads read
_timings: List[float] = []
_count = 0
_cpu = 0          # ns of CPU the probe thread took since the last reset (its own cost, whole turns)
_rng = random.Random()

_wait = int(ITERATIONS / SHARE)   # ns of the probe thread's sleep after a turn (its turn's CPU over SHARE)
_running = False  # stages ran since the probe thread last looked (set by the hook)
_parked = False   # the probe thread waits for the hook
_wake = threading.Event()
_ident: Optional[int] = None      # the probe thread, once started in this process
_stopped = False


def loop(iterations: int) -> int:
    """The reference loop: fixed pure-Python work, the same on every machine."""
    x = 0
    for i in range(iterations):
        x += i * i
    return x


def probe() -> int:
    """One timing on the calling thread (after WARM untimed turns), kept; returns its CPU time (ns)."""
    global _count
    loop(WARM)
    c0 = time.thread_time_ns()
    loop(ITERATIONS)
    cpu = time.thread_time_ns() - c0
    if cpu > 0:
        with _lock:
            _count += 1
            if len(_timings) < KEEP:
                _timings.append(cpu / ITERATIONS)
            else:   # reservoir sampling: every timing of the run has the same chance of being kept
                k = _rng.randrange(_count)
                if k < KEEP:
                    _timings[k] = cpu / ITERATIONS
    return cpu


def hook() -> int:
    """The backends' probe hook, on the stage's thread after an outermost exit once due: marks the stages as
    running, wakes a parked probe thread (starts it the first time); returns the ns until it is due again (half the
    probe's wait: the mark is set at least once while the probe thread sleeps)."""
    global _running
    _running = True
    if _ident is None:
        _start()
    elif _parked:
        _wake.set()
    return _wait // 2


def _start() -> None:
    global _ident
    if _stopped:
        return
    _ident = -1   # starting: the hook does not start a second
    try:
        _thread.start_new_thread(_run, ())   # not threading.Thread: its start() waits until the thread runs
    except RuntimeError:   # no thread can be started (interpreter ending, a thread limit): no probe
        pass


def _run() -> None:
    """The probe thread: a timing, then a sleep of its whole turn's CPU time (its wake, the interpreter lock, the
    timing) over SHARE; parked while no stage runs."""
    global _ident, _running, _parked, _wait, _cpu
    _ident = threading.get_ident()
    try:
        last = time.thread_time_ns()
        while not _stopped:
            if not _running:   # no stage since the last timing: wait for one (a hook missed here wakes it later)
                _parked = True
                _wake.wait()
                _wake.clear()
                _parked = False
                continue
            _running = False
            probe()
            now = time.thread_time_ns()
            spent, last = now - last, now
            with _lock:
                _cpu += spent
            _wait = int(max(spent, ITERATIONS) / SHARE)
            time.sleep(_wait / 1e9)
    except BaseException:   # the interpreter ending under it, or a failure: the probe stops, the program goes on
        pass


def ident() -> Optional[int]:
    """The probe thread's id (threading.get_ident()), once it runs; None before."""
    return _ident if _ident is not None and _ident > 0 else None


def cpu_ns() -> int:
    """The probe thread's CPU time since the last reset, counted by whole turns (meta.overhead.probe_cpu_ns)."""
    return _cpu


def reset() -> None:
    """Forget the timings (instrument.reset(): a new window)."""
    global _timings, _count, _cpu
    with _lock:
        _timings, _count, _cpu = [], 0, 0


def after_fork_child() -> None:
    """A forked child has no probe thread and new locks: the next due exit starts its own; no parent's timings."""
    global _lock, _wake, _ident, _running, _parked
    _lock, _wake = threading.Lock(), threading.Event()
    _ident, _running, _parked = None, False, False
    reset()


@atexit.register
def _stop() -> None:
    global _stopped
    _stopped = True
    _wake.set()


def summary() -> Optional[Dict[str, Any]]:
    """meta.machine.probe: ns per iteration, the 10 % trimmed mean of the timings (a mean, as a stage's CPU time
    per call is: on a machine whose speed switches between modes, such as a core shared with a busy hyperthread
    sibling now and then, it weighs the modes as the stages' calls do, where a median jumps from one to the
    other); se_log, the standard error of its log (from the winsorized variance); the median; how many timings
    were taken and kept; the probe thread's CPU time (its own cost: the timings, its wakes and the interpreter lock's
    hand-over).  None under MIN_TIMINGS."""
    with _lock:
        xs, count, cpu = sorted(_timings), _count, _cpu
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
            "timings": count, "kept": n, "iterations": ITERATIONS, "cpu_ns": cpu}
