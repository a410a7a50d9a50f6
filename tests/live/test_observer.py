"""Watching must not change the watched (issue 40): beside a CPU hog on the same core, the SDK's reads at stage
boundaries must not pull the scheduler's preemptions into the stages, and what the SDK says a read costs is what
it costs the thread.  Native backend; configurations compared interleaved in the same window."""
import os
import resource
import statistics
import subprocess
import sys
import time

import pytest

import instrument
from conftest import BACKENDS
from instrument.live import backend as live_backend
from instrument.live import collector


@pytest.fixture(autouse=True)
def native():
    """These tests are about the C core's reads."""
    if BACKENDS["native"] is None:
        pytest.skip("C extension not built")
    old = live_backend.current
    collector.use_backend(BACKENDS["native"])
    yield BACKENDS["native"]
    collector.use_backend(old)

# whole configurations: configure() keeps the options it is not given
TIMING_ONLY = dict(counters="none", cpu_clock=False, overhead_budget=0.01)
DEFAULT = dict(counters="default", cpu_clock=True, overhead_budget=0.01)
EVERY_CALL = dict(counters="default", cpu_clock=True, overhead_budget=None)


def work(n):
    x = 0
    for i in range(n):
        x += i * i
    return x


def per_100us():
    """Iterations of work() in ~100 µs of this thread's CPU (the quietest of several timings)."""
    best = None
    for _ in range(7):
        t = time.thread_time_ns()
        work(20_000)
        d = time.thread_time_ns() - t
        best = d if best is None or d < best else best
    return max(1, int(20_000 * 100_000 / best))


def ivcsw():
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw


def block(config, small, iterations):
    """`iterations` of a ~100 µs stage then ~900 µs outside any stage: the stage's wall total, the loop's wall and
    the loop's involuntary switches."""
    instrument.configure(**config)
    instrument.reset()
    st = instrument.stage("small")
    sw, t = ivcsw(), time.perf_counter_ns()
    for _ in range(iterations):
        with st:
            work(small)
        work(9 * small)
    wall, sw = time.perf_counter_ns() - t, ivcsw() - sw
    s = instrument.snapshot()["small"]
    assert (s.cpu_calls > 0) == (config is not TIMING_ONLY)   # the configuration in force reads, or not
    return s.wall_total, wall, sw


def test_a_small_stage_keeps_its_share_beside_a_hog(shared_core):
    """Before, the default configuration's reads put the stage at 2-3x its share, every call read at 4-7x
    (its CPU-clock reads preempted the thread inside the stage).  Shares pooled over interleaved blocks: other load
    on the machine moves single blocks by +-50 %."""
    small = per_100us()
    totals = {k: [0, 0, 0] for k in ("timing", "default", "every")}
    try:
        for _ in range(7):   # interleaved: load changes alike for every configuration
            for name, config in (("timing", TIMING_ONLY), ("default", DEFAULT), ("every", EVERY_CALL)):
                for k, v in enumerate(block(config, small, 300)):
                    totals[name][k] += v
    finally:
        instrument.configure()
    share = {k: v[0] / v[1] for k, v in totals.items()}
    sw = {k: v[2] for k, v in totals.items()}
    assert sw["timing"] > 0.1 * 7 * 300, sw   # the hog took the core from the loop: preemptions were to be placed
    # about 60 preemptions land in a configuration's stage windows here, each share ±13 % by chance alone: the
    # bounds are those the old reads broke by far (2-3x and 4-7x); benchmarks/observer_effect.py measures the
    # issue's 1.3x and 1.5x (1.00x and 1.03x)
    assert share["default"] <= 1.6 * share["timing"], (share, sw)
    assert share["every"] <= 1.8 * share["timing"], (share, sw)
    assert sw["default"] <= 1.2 * sw["timing"], (share, sw)


def test_per_read_ns_is_what_a_read_costs_the_thread():
    """Every call read against timing only, the thread's CPU time per call measured around the loops by the test:
    the difference per call is the reads' cost, which meta.overhead.per_read_ns states within 30 % (medians of
    interleaved blocks)."""
    n, blocks = 2_000, 7
    diffs, stated = [], []
    try:
        for _ in range(blocks):
            per = {}
            for name, config in (("timing", TIMING_ONLY), ("every", EVERY_CALL)):
                instrument.configure(**config)
                instrument.reset()
                st = instrument.stage("empty")
                t = time.thread_time_ns()
                for _ in range(n):
                    with st:
                        pass
                per[name] = (time.thread_time_ns() - t) / n
                if name == "every":
                    stated.append(instrument.snapshot().meta["overhead"]["per_read_ns"])
            diffs.append(per["every"] - per["timing"])
    finally:
        instrument.configure()
    truth, said = statistics.median(diffs), statistics.median(stated)
    assert said == pytest.approx(truth, rel=0.30), (diffs, stated)


def test_a_burst_during_calibration_does_not_bias_it():
    """A CPU hog on the calibrating core for the first part of calibrate() (it spins 20 ms, then exits): the
    figures stay near those of quiet calibrations taken just before and after."""
    _native = BACKENDS["native"]
    core = min(os.sched_getaffinity(0))
    old = os.sched_getaffinity(0)
    burst = ("import os, sys, time; os.sched_setaffinity(0, {%d}); sys.stdout.write('go\\n'); sys.stdout.flush()\n"
             "t = time.perf_counter() + 0.02\nwhile time.perf_counter() < t: pass" % core)
    quiet, hit = [], []
    try:
        os.sched_setaffinity(0, {core})
        for _ in range(3):
            quiet.append(_native.calibrate(400))
            p = subprocess.Popen([sys.executable, "-c", burst], stdout=subprocess.PIPE)
            p.stdout.readline()   # it is spinning now
            hit.append(_native.calibrate(400))
            p.wait()
        quiet.append(_native.calibrate(400))
    finally:
        os.sched_setaffinity(0, old)
        instrument.configure()
    for key in ("read_ns", "base_ns"):
        q, h = [c[key] for c in quiet], [c[key] for c in hit]
        assert statistics.median(h) <= 1.25 * max(q), (key, q, h)
