"""The overhead budget and honest CPU time: short stages are read on a random subset of calls and their CPU
time and counters estimated; the reads' own cost is taken out of each call's CPU time; system time is split
out.  Checked against independent truths: fresh pages touched (page faults), the thread CPU clock around
fixed work, getrusage around a kernel-heavy loop."""
import mmap
import resource
import statistics
import time

import pytest

import instrument

PAGE = mmap.PAGESIZE


def work(iterations):
    x = 0
    for i in range(iterations):
        x += i
    return x


def iterations_for(ns):
    """Loop iterations that take about `ns` of CPU here."""
    n = 20_000
    t = time.thread_time_ns()
    work(n)
    per = max((time.thread_time_ns() - t) / n, 1e-3)
    return max(int(ns / per), 1)


def touch_pages(n):
    m = mmap.mmap(-1, n * PAGE)
    for k in range(0, n * PAGE, PAGE):
        m[k] = 1
    m.close()


def test_sampled_page_faults_match_the_pages_touched(backend):
    """300 calls each touching 100 fresh pages: 30,000 faults, estimated from a sample of the calls."""
    st = instrument.stage("touch")
    for _ in range(300):
        with st:
            touch_pages(100)
    s = instrument.snapshot()["touch"]
    c = s.counters["page-faults"]
    assert c["counted_calls"] == 300
    assert c["total"] == pytest.approx(30_000, rel=0.05), c


def test_a_stage_long_enough_is_read_on_every_call(backend):
    st = instrument.stage("long")
    n = iterations_for(2_000_000)
    for _ in range(20):
        with st:
            work(n)
    s = instrument.snapshot()["long"]
    assert s.cpu_reads == s.cpu_calls == 20 and not s.cpu_estimated
    assert s.counters["task-clock"]["read_calls"] == 20


def test_sampled_cpu_of_a_200us_stage_matches_the_thread_clock(backend):
    n = iterations_for(200_000)
    st = instrument.stage("spin")
    ratios = []
    for _ in range(3):
        instrument.reset()
        t = time.thread_time_ns()
        for _ in range(300):
            work(n)
        truth = time.thread_time_ns() - t
        for _ in range(300):
            with st:
                work(n)
        s = instrument.snapshot()["spin"]
        assert s.cpu_calls == 300
        ratios.append(s.cpu_total / truth)
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.07), ratios


def test_alternating_costs_are_not_biased_by_the_sampling(backend):
    """Calls alternate between a short and a ten times longer cost: a sampler that kept in step with the
    pattern would see only one of them; a random one estimates the sum."""
    short, long_ = iterations_for(20_000), iterations_for(200_000)
    st = instrument.stage("alt")
    estimates, sampled = [], []
    for _ in range(4):
        instrument.reset()
        t = time.thread_time_ns()
        for i in range(1500):
            work(short if i % 2 else long_)
        truth = time.thread_time_ns() - t
        for i in range(1500):
            with st:
                work(short if i % 2 else long_)
        s = instrument.snapshot()["alt"]
        estimates.append(s.cpu_total / truth)
        sampled.append(s.cpu_reads < s.cpu_calls)
    assert all(sampled), "the stage should be short enough to be sampled under the 1 % budget"
    # one trial's estimate spreads by about 5 % (a third of 1,500 calls of two costs ten times apart); a sampler
    # in step with the pattern would be off by 80 %
    assert statistics.mean(estimates) == pytest.approx(1.0, abs=0.08), estimates


def test_the_reads_stay_within_the_budget(backend):
    st = instrument.stage("tiny")
    for _ in range(20_000):
        with st:
            pass
    snap = instrument.snapshot()
    o, s = snap.meta["overhead"], snap["tiny"]
    assert o["budget"] == 0.01 and s.cpu_estimated
    assert s.counters["page-faults"]["read_calls"] < s.counters["page-faults"]["counted_calls"] == 20_000
    # what the reads cost, against the stage's own wall time: within the budget, give or take the first call
    assert s.cpu_reads * o["per_read_ns"] <= 0.01 * s.wall_total + 2 * o["per_read_ns"], (s.cpu_reads, o)
    assert o["estimated_ns"] == round(o["calls"] * o["per_call_ns"] + o["read_calls"] * o["per_read_ns"])
    assert o["calls"] == 20_000 and o["read_calls"] == s.cpu_reads


def test_no_budget_reads_every_call(backend):
    instrument.configure(overhead_budget=None)
    st = instrument.stage("tiny")
    for _ in range(2_000):
        with st:
            pass
    s = instrument.snapshot()["tiny"]
    assert s.cpu_reads == s.cpu_calls == 2_000 and s.cpu_read_calls is None
    assert s.counters["task-clock"]["read_calls"] == s.counters["task-clock"]["counted_calls"] == 2_000


@pytest.mark.parametrize("bad", [-0.1, 0, 1.5, "abc", True, float("nan")])
def test_bad_budget_is_refused_with_the_option_and_the_range(bad):
    with pytest.raises(ValueError) as e:
        instrument.configure(overhead_budget=bad)
    assert "overhead_budget" in str(e.value) and "greater than 0 and at most 1" in str(e.value)


def test_bad_budget_in_the_environment_keeps_the_default():
    from conftest import run_python
    r = run_python("import instrument; print(instrument.configure().overhead_budget)",
                   env={"INSTRUMENT_OVERHEAD_BUDGET": "2"})
    assert r.returncode == 0 and r.stdout.strip() == "0.01"
    assert "INSTRUMENT_OVERHEAD_BUDGET" in r.stderr and "at most 1" in r.stderr
    r = run_python("import instrument; print(instrument.configure().overhead_budget)",
                   env={"INSTRUMENT_OVERHEAD_BUDGET": "none"})
    assert r.stdout.strip() == "None"


# ------------------------------------------------- CPU time without the reads
@pytest.mark.parametrize("counters", ["default", "none"])   # CPU from task-clock, or from the thread CPU clock
def test_cpu_never_exceeds_wall_on_one_thread(backend, counters):
    instrument.configure(counters=counters, overhead_budget=None)
    n = iterations_for(20_000)
    st = instrument.stage("spin")
    for _ in range(2_000):
        with st:
            work(n)
    s = instrument.snapshot()["spin"]
    assert s.cpu_calls == 2_000
    assert 0.8 <= s.cpu_total / s.wall_total <= 1.02, s.cpu_total / s.wall_total


@pytest.mark.parametrize("counters", ["default", "none"])
@pytest.mark.parametrize("ns", [5_000, 20_000, 1_000_000])
def test_cpu_of_short_stages_matches_the_thread_clock(backend, counters, ns):
    """Before the correction about 1 µs of the reads' own cost landed in every call (+20 % on 5 µs)."""
    if backend.__name__.endswith("pure") and ns == 5_000:
        pytest.skip("the pure twin's reads cost about 9 µs each here: its correction is not finer than 5 µs")
    instrument.configure(counters=counters, overhead_budget=None)
    n = iterations_for(ns)
    calls = max(20, min(2_000, 40_000_000 // ns))
    st = instrument.stage("spin")
    ratios = []
    for _ in range(5):
        instrument.reset()
        t = time.thread_time_ns()
        for _ in range(calls):
            work(n)
        truth = time.thread_time_ns() - t
        for _ in range(calls):
            with st:
                work(n)
        ratios.append(instrument.snapshot()["spin"].cpu_total / truth)
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.05), ratios


# -------------------------------------------------------------- system time
def test_kernel_heavy_stage_shows_its_system_time(backend):
    np = pytest.importorskip("numpy")
    st = instrument.stage("alloc")
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    for _ in range(30):
        with st:
            a = np.ones(50_000_000 // 8)   # 50 MB of fresh pages: the time goes to page faults in the kernel
            del a
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    truth = (r1.ru_stime - r0.ru_stime) / ((r1.ru_stime - r0.ru_stime) + (r1.ru_utime - r0.ru_utime))
    s = instrument.snapshot()["alloc"]
    assert truth >= 0.5, truth
    assert s.sys_share >= 0.5 and s.sys_share == pytest.approx(truth, abs=0.15), (s.sys_share, truth)
    assert s.cpu_user_total + s.cpu_sys_total == s.cpu_total
    assert s.verdict["verdict"] != "compute-bound", s.verdict


def test_a_user_space_spin_has_little_system_time(backend):
    n = iterations_for(1_000_000)
    st = instrument.stage("spin")
    for _ in range(100):
        with st:
            work(n)
    s = instrument.snapshot()["spin"]
    assert s.sys_share is not None and s.sys_share < 0.2, s.sys_share


def test_no_split_when_turned_off(backend):
    instrument.configure(cpu_split=False)
    with instrument.stage("x"):
        work(1000)
    s = instrument.snapshot()["x"]
    assert s.cpu_total is not None and s.cpu_sys_total is None and "sys" not in s.cpu_ns
