"""The log2-64 histogram scheme: index, bounds, quantiles, the C histogram's real memory."""
import ctypes
import gc
import threading
import time

import numpy as np
import pytest

import instrument
from instrument import histogram as _hist


# ------------------------------------------------------------------ histogram
def test_histogram_index_same_in_c_and_python():
    from conftest import BACKENDS
    rng = np.random.default_rng(0)
    vals = list(rng.integers(0, 2 ** 50, 5000)) + list(range(0, 300)) + [2 ** k for k in range(64)] + \
        [2 ** k - 1 for k in range(1, 64)] + [2 ** 64 - 1]
    for v in vals:
        v = int(v)
        i = _hist.index(v)
        if BACKENDS["native"] is not None:
            assert BACKENDS["native"].hist_index(v) == i
        lo, hi = _hist.bounds(i)
        if i != _hist.LAST:
            assert lo <= v < hi
            assert abs(_hist.midpoint(i) - v) <= v / 128 + 0.5


def test_percentiles_within_one_percent_of_numpy():
    rng = np.random.default_rng(42)
    vals = rng.lognormal(mean=13.0, sigma=1.2, size=100_000).astype(np.int64)  # ~0.4 ms median
    h = {}
    for v in vals:
        i = _hist.index(int(v))
        h[i] = h.get(i, 0) + 1
    qs = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999]
    est = _hist.quantiles(h, qs, int(vals.min()), int(vals.max()))
    exact = np.percentile(vals, [q * 100 for q in qs])
    for e, x in zip(est, exact):
        assert abs(e - x) / x < 0.01, (e, x)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _malloc_in_use():
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2().uordblks


def _blocks(snap, names):
    return sum(len({i >> _hist.SUB_BITS for i in snap[n].hist}) for n in names)


def spin_ns(ns):
    t0 = time.perf_counter_ns()
    while time.perf_counter_ns() - t0 < ns:
        pass


@pytest.fixture
def native_malloc():
    """The C core records (restored after), where glibc's malloc statistics can be read."""
    native = pytest.importorskip("instrument._native")
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc without mallinfo2")
    from conftest import _recording_with
    yield from _recording_with(native)


def test_c_histogram_allocates_per_block_seen_not_per_call(native_malloc):
    """The C histogram's real allocation, read from glibc's malloc statistics: each
    power of two of latency a stage sees costs one 512-byte block the first time,
    and further calls in blocks already seen allocate nothing."""
    instrument.configure(counters="none", cpu_clock=False, nvtx=False, exemplars=0)   # the histogram alone
    instrument.reset()
    names = [f"h{i}" for i in range(1500)]
    stages = [instrument.stage(n) for n in names]
    for s in stages:             # nodes, stats records and the first blocks
        with s:
            pass
    b0 = _blocks(instrument.snapshot(), names)
    gc.collect()
    gc.disable()
    try:
        m0 = _malloc_in_use()
        for s in stages:         # about 40 µs: a power of two no call has reached yet
            with s:
                spin_ns(40_000)
        m1 = _malloc_in_use()
        b1 = _blocks(instrument.snapshot(), names)
        gc.collect()
        m1 = (m1, _malloc_in_use())
        for _ in range(30):      # many more calls, in blocks already allocated
            for s in stages:
                with s:
                    pass
        m2 = _malloc_in_use()
    finally:
        gc.enable()
    snap = instrument.snapshot()
    b2 = _blocks(snap, names)
    assert all(snap[n].calls == 32 for n in names)
    # nearly every stage reached a new power of two; a first call preempted for tens of
    # µs (a loaded machine) already holds the block its 40 µs call lands in
    assert b1 - b0 >= 0.9 * len(names), (b1 - b0, len(names))
    per_block = (m1[0] - m0) / (b1 - b0)
    assert 496 <= per_block <= 560, per_block          # HIST_SUB uint64 counters (the blocks share one array)
    # 45,000 more calls: growth only for the few blocks they reached for the first time
    assert abs((m2 - m1[1]) - (b2 - b1) * per_block) <= 16 * 1024, (m2 - m1[1], b2 - b1)


def test_c_core_holds_a_few_kb_per_thread_and_stage_whatever_the_calls(native_malloc):
    """The C core's whole allocation per (thread, stage) pair, read from glibc's malloc statistics (all arenas) while
    4 threads that each ran 1,000 stages are alive, with the default configuration (the ten default counters, every
    quantity a read call measures): at most 6 KB a pair after one call (one histogram block, one stratum of the
    estimates' sums), and 30 more calls a pair add at most what a further histogram block and a further stratum
    take (calls of other lengths, or preempted ones, fill them), never anything per call."""
    instrument.configure(overhead_budget=None)   # every call read: every quantity's sums made
    instrument.reset()
    stages = [instrument.stage(f"p{i}") for i in range(1000)]

    def work(rounds=1):
        for _ in range(rounds):
            with instrument.stage("req"):
                for st in stages:
                    with st:
                        pass
    first = threading.Thread(target=work)      # the nodes themselves, once for all threads
    first.start()
    first.join()
    go, done, stop = [threading.Event() for _ in range(4)], [], threading.Event()

    def thread(k):
        work()
        done.append(k)
        go[k].wait()
        work(30)
        done.append(k)
        stop.wait()
    gc.collect()
    gc.disable()
    try:
        m0 = _malloc_in_use()
        ts = [threading.Thread(target=thread, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        while len(done) < 4:
            time.sleep(0.005)
        m1 = _malloc_in_use()
        for g in go:
            g.set()
        while len(done) < 8:
            time.sleep(0.005)
        m2 = _malloc_in_use()
        stop.set()
        for t in ts:
            t.join()
    finally:
        gc.enable()
    snap = instrument.snapshot()
    assert snap["req/p0"].calls == 1 + 4 * 31 and snap["req/p0"].counters   # counters were on
    per_pair = (m1 - m0) / 4000
    assert per_pair <= 6 * 1024, per_pair
    quantities = 8 + len(snap["req/p0"].counters)       # the scalars and the counters: 176 bytes each a stratum
    further = 512 + quantities * 176 + 2 * 16           # a histogram block and a stratum, with malloc's headers
    assert (m2 - m1) / 4000 <= further, ((m2 - m1) / 4000, further)   # 128 bytes a call would be 3,840
