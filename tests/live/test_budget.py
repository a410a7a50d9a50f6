"""The overhead budget and honest CPU time: short stages are read on a random subset of calls and their CPU
time and counters estimated; the reads' own cost is taken out of each call's CPU time; system time is split
out.  Checked against independent truths: fresh pages touched (page faults), the thread CPU clock around
fixed work, getrusage around a kernel-heavy loop."""
import mmap
import resource
import time

import pytest

import instrument
from instrument.snapshot import ci99

pytestmark = pytest.mark.native_only   # what only the C core records (conftest.py)

PAGE = mmap.PAGESIZE


def work(iterations):
    x = 0
    for i in range(iterations):
        x += i
    return x


PER_ITERATION = [1.0]


def iterations_for(ns):
    """Loop iterations that take about `ns` of CPU here."""
    n = 20_000
    t = time.thread_time_ns()
    work(n)
    per = max((time.thread_time_ns() - t) / n, 1e-3)
    PER_ITERATION[0] = per
    return max(int(ns / per), 1)


def clock_read_ns():
    """What one thread_time_ns() read adds to a window it closes (a system call on some VMs)."""
    d = []
    for _ in range(201):
        t = time.thread_time_ns()
        d.append(time.thread_time_ns() - t)
    return sorted(d)[100]


def interleaved(st, n, calls, rounds, pattern=None, per_round=None, recalibrate=False):
    """CPU the stage recorded / the thread CPU time of the same work unstaged.  The CPU time of fixed work
    drifts by 20 % from one 10 ms window to the next on a shared VM, so the two sides alternate every half
    millisecond or so and both see the same drift.  Returns (ratio, the last round's stage, the ratio's standard
    deviation from the estimates' own variance); each round's (ratio, its standard deviation) appended to
    `per_round` where given.  recalibrate: each round calibrates in its own window (configure()), the way its
    truth is measured, so that a burst of load during one calibration moves one round, not the run."""
    read = clock_read_ns()
    staged = truth = var = 0
    s = None
    for r in range(rounds):
        if recalibrate:
            instrument.configure()
        instrument.reset()
        truth0 = truth
        sizes = [n if pattern is None else pattern(i) for i in range(calls)]
        call_ns = PER_ITERATION[0] * sum(sizes) / len(sizes)
        step = max(2, int(500_000 / call_ns) // 2 * 2)   # about 0.5 ms of work (pairs kept whole)
        for lo in range(0, len(sizes), step):
            chunk = sizes[lo:lo + step]
            t = time.thread_time_ns()
            for k in chunk:
                work(k)
            truth += time.thread_time_ns() - t - read
            for k in chunk:
                with st:
                    work(k)
        s = instrument.snapshot()[st.name]
        staged += s.cpu_total
        var += s.cpu_var
        if per_round is not None:
            per_round.append((s.cpu_total / (truth - truth0), s.cpu_var ** 0.5 / (truth - truth0)))
    return staged / truth, s, var ** 0.5 / truth


def touch_pages(n):
    m = mmap.mmap(-1, n * PAGE)
    for k in range(0, n * PAGE, PAGE):
        m[k] = 1
    m.close()


def minor_faults():
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def test_sampled_page_faults_match_the_pages_touched(backend):
    """300 calls each touching 100 fresh pages, estimated from a sample of the calls: the thread's own minor-fault
    count around the loop lies within the estimate's 99 % interval (plus the few faults outside the stage)."""
    st = instrument.stage("touch")
    f0 = minor_faults()
    for _ in range(300):
        with st:
            touch_pages(100)
    truth = minor_faults() - f0
    c = instrument.snapshot()["touch"].counters["page-faults"]
    assert c["counted_calls"] == 300 and c["estimated"] and c["read_calls"] < 300
    lo, hi = ci99(c["total"], c.get("var", 0))
    assert lo - 0.01 * truth <= truth <= hi + 0.01 * truth, (c, truth)


def test_a_stage_long_enough_is_read_on_every_call(backend):
    # a stage whose CPU time makes one call's reads < 1 % of it, by what the run's read calls cost (the budget's
    # figure): around ms of real work a read costs the thread 2-5x what it costs around empty calls (cold caches)
    for name in ("warm", "up", "first"):   # a stage's first 8 calls are read: 24 read calls, most of them timed
        for _ in range(8):
            with instrument.stage(name):
                work(iterations_for(1_000_000))
    o = instrument.snapshot().meta["overhead"]
    st = instrument.stage("long")
    n = iterations_for(5 * o["per_read_ns"] / o["budget"])
    for _ in range(20):
        with st:
            work(n)
    s = instrument.snapshot()["long"]
    assert s.cpu_reads == s.cpu_calls == 20 and not s.cpu_estimated
    assert s.counters["task-clock"]["read_calls"] == 20


def test_sampled_cpu_of_a_200us_stage_matches_the_thread_clock(backend):
    """A stage sampled under the budget: its CPU against the thread clock of the same work, within its own
    99 % interval and the correction's precision (3 %)."""
    o = instrument.snapshot().meta["overhead"]
    ns = min(200_000, 0.3 * o["per_read_ns"] / o["budget"])   # short enough to be sampled on either backend
    rounds = []
    interleaved(instrument.stage("spin"), iterations_for(ns), 100, 9, per_round=rounds, recalibrate=True)
    s = instrument.snapshot()["spin"]
    assert s.cpu_calls == 100 and s.cpu_estimated
    assert_median_round(rounds, 0.03)


def assert_median_round(rounds, precision):
    """The median round lands within its own 99 % interval and the correction's precision: a burst of load
    during one round's calibration moves that round only (9 rounds: 5 would have to miss)."""
    ratio, sd = sorted(rounds)[len(rounds) // 2]
    assert abs(ratio - 1) <= 2.576 * sd + precision, rounds


def test_alternating_costs_are_not_biased_by_the_sampling(backend):
    """Calls alternate between a short and a ten times longer cost: a sampler that kept in step with the
    pattern would see only one of them; a random one estimates the sum, within its own interval."""
    short, long_ = iterations_for(20_000), iterations_for(200_000)
    rounds = []
    interleaved(instrument.stage("alt"), 0, 500, 9, pattern=lambda i: short if i % 2 else long_, per_round=rounds,
                recalibrate=True)
    s = instrument.snapshot()["alt"]
    assert s.cpu_reads < s.cpu_calls, "the stage should be short enough to be sampled under the 1 % budget"
    assert_median_round(rounds, 0.04)   # a sampler in step with the pattern would be off by 80 %


def test_the_reads_stay_within_the_budget(backend):
    st = instrument.stage("tiny")
    for _ in range(200_000):
        with st:
            pass
    snap = instrument.snapshot()
    o, s = snap.meta["overhead"], snap["tiny"]
    assert o["budget"] == 0.01 and s.cpu_estimated
    assert s.counters["page-faults"]["read_calls"] < s.counters["page-faults"]["counted_calls"] == 200_000
    # the chance is judged on the stage's CPU time, which is at most its running time, over what a read costs: the
    # calibrated cost at first, then what the run's reads cost so far (load moves it), so the lower of the two gives
    # the most reads the budget could grant; give or take the first calls (always read) and a random count's spread
    expected = max(0.01 * s.covered_run / min(o["per_read_ns"], o["per_read_calibrated_ns"]), 1)
    assert s.cpu_reads <= 8 + expected + 4 * expected ** 0.5, (s.cpu_reads, expected, o)
    assert o["estimated_ns"] == round(o["calls"] * o["per_call_ns"] + o["read_calls"] * o["per_read_ns"] + (o["probe_cpu_ns"] or 0))
    assert o["calls"] == 200_000 and o["read_calls"] == s.cpu_reads


def test_no_budget_reads_every_call(backend):
    instrument.configure(overhead_budget=None)
    st = instrument.stage("tiny")
    for _ in range(2_000):
        with st:
            pass
    s = instrument.snapshot()["tiny"]
    assert s.cpu_reads == s.cpu_calls == 2_000 and s.cpu_read_calls is None
    assert s.counters["task-clock"]["read_calls"] == s.counters["task-clock"]["counted_calls"] == 2_000
    assert not s.cpu_estimated and s.cpu_var == 0 and "ci99" not in s.cpu_ns   # exact: no interval


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
@pytest.mark.parametrize("counters", ["default", "none"])
@pytest.mark.parametrize("ns", [5_000, 20_000, 1_000_000])
def test_cpu_of_short_stages_matches_the_thread_clock(backend, counters, ns):
    """Before the correction 1.2 to 2 µs of the reads' own cost landed in every call (+25 to +40 % on 5 µs)."""
    calls = max(10, min(1_000, 10_000_000 // ns))
    rounds = []
    for _ in range(20):
        # each round calibrates in its own window: the correction is measured beside the calls it corrects, the
        # way the truth is (a burst of load during one calibration moves one round, not the run)
        instrument.configure(counters=counters, overhead_budget=None)
        interleaved(instrument.stage("spin"), iterations_for(ns), calls, 1, per_round=rounds)
        s = instrument.snapshot()["spin"]
        assert s.cpu_reads == s.cpu_calls == calls
    # the correction is about 1 µs a call here, known to ±0.2 µs from one calibration to the next on a quiet
    # machine and ±0.6 µs on a loaded one: 5 µs stages land within 15 % (uncorrected: +25 % or more), longer
    # ones within 5 %.  The median round: a hog sharing the core slows the
    # two sides of a round unevenly (rounds spread by ±20 % at 5 µs)
    tol = 0.15 if ns == 5_000 else 0.05
    ratios = sorted(ratio for ratio, _ in rounds)
    assert ratios[len(ratios) // 2] == pytest.approx(1.0, abs=tol), ratios


# -------------------------------------------------------------- system time
def test_kernel_heavy_stage_shows_its_system_time(backend):
    np = pytest.importorskip("numpy")
    st = instrument.stage("alloc")
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    for _ in range(30):
        with st:
            a = np.empty(50_000_000, dtype=np.uint8)   # 50 MB of fresh pages, one byte written in each: the time
            a[::PAGE] = 1                               # goes to page faults (zeroing pages) in the kernel
            del a
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    truth = (r1.ru_stime - r0.ru_stime) / ((r1.ru_stime - r0.ru_stime) + (r1.ru_utime - r0.ru_utime))
    s = instrument.snapshot()["alloc"]
    if truth < 0.5:   # seen once in a suite beside hogs (0.26): the kernel's own split holds no kernel-heavy loop
        pytest.skip(f"the kernel split this loop's CPU {truth:.2f} system: nothing kernel-heavy to judge here")
    # the kernel splits a thread's CPU into user and system by the scheduler tick (4 ms here), scaled to the exact
    # total: the split of each 16 ms call is known to a tick or so, and the stage's windows and the loop's differ
    # by that; both must show a stage that is mostly system time
    assert s.sys_share >= 0.5, (s.sys_share, truth)
    assert s.cpu_user_total + s.cpu_sys_total == s.cpu_total
    # on the CPU it is kernel-bound; on a machine so loaded that it waited in the run queue for a CPU for a
    # verdict_runqueue_share of its time (and more than it was blocked), cpu-starved comes first (verdict.py)
    rq, blocked = (max(s.split_part(p, True) or 0, 0) / s.wall_self for p in ("runqueue", "blocked"))
    starved = rq >= instrument.current_config().verdict_runqueue_share and rq >= blocked
    assert s.verdict["verdict"] == ("cpu-starved" if starved else "kernel-bound"), (s.verdict, rq, blocked)


def test_a_user_space_spin_has_little_system_time(backend):
    instrument.configure(overhead_budget=None)   # every call read: the stage's system time a sum, not an estimate
    n = iterations_for(1_000_000)               # from a few read calls of tick-sampled figures
    st = instrument.stage("spin")
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    for _ in range(100):
        with st:
            work(n)
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    sys_time, user = r1.ru_stime - r0.ru_stime, r1.ru_utime - r0.ru_utime
    truth = sys_time / (sys_time + user)
    s = instrument.snapshot()["spin"]
    # no more system time than the kernel gave the thread around the loop: its split is by the scheduler tick, and
    # beside CPU hogs it has given a pure-Python spin 0 to 0.7 of system time in one suite or another (a tick taken
    # in the kernel on the way back to the spin); the stage's windows and the loop's differ by a tick or so a call
    assert s.sys_share is not None and s.sys_share < truth + 0.2, (s.sys_share, truth)


def test_no_split_when_turned_off(backend):
    instrument.configure(cpu_split=False)
    with instrument.stage("x"):
        work(1000)
    s = instrument.snapshot()["x"]
    assert s.cpu_total is not None and s.cpu_sys_total is None and "sys" not in s.cpu_ns
