"""The statistics of the diff, against scipy and against synthetic snapshots drawn with fixed seeds from
a machine whose speed wanders (the way a shared VM's does): identical code is rarely called changed
anywhere, a real change is seen, on every basis."""
import math

import numpy as np
import pytest
from scipy import stats

from instrument import histogram as _hist
from instrument.analysis import significance as S
from instrument.analysis.diff import diff, run_variance, spread
from instrument.snapshot import Snapshot, StageStats

MS = 1_000_000


# ------------------------------------------------------------- distributions and tests against scipy
@pytest.mark.parametrize("df", [1, 2.5, 4, 9, 30, 400])
def test_student_t_matches_scipy(df):
    for t in (0.05, 0.7, 1.9, 3.3, 8.0):
        assert S.t_sf(t, df) == pytest.approx(stats.t.sf(t, df), rel=1e-9, abs=1e-14)
        assert S.t_sf(-t, df) == pytest.approx(stats.t.sf(-t, df), rel=1e-9)
    for q in (0.25, 0.025, 0.005, 1e-4):
        assert S.t_ppf(q, df) == pytest.approx(stats.t.isf(q, df), rel=1e-7)
    assert S.normal_ppf(0.005) == pytest.approx(stats.norm.isf(0.005), rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_paired_test_is_students_paired_t_on_the_log_ratios(seed):
    rng = np.random.default_rng(seed)
    before = rng.lognormal(11, 0.2, 12)
    after = before * rng.lognormal(0.02 * seed, 0.03, 12)
    logs = list(np.log(after / before))
    t = S.paired_test(logs, alpha=0.05, min_change=0)
    ref = stats.ttest_rel(np.log(after), np.log(before))
    assert t.p == pytest.approx(ref.pvalue, rel=1e-9)
    lo, hi = ref.confidence_interval(0.95)
    assert t.interval == pytest.approx((math.expm1(lo), math.expm1(hi)), rel=1e-7)
    assert t.estimate == pytest.approx(math.expm1(np.mean(logs)))
    assert t.basis == "turns" and t.n == (12, 12)


def test_window_test_is_welch_on_the_logs_plus_the_drift_between_halves():
    rng = np.random.default_rng(7)
    b, a = rng.lognormal(10, 0.1, 3), rng.lognormal(10.1, 0.1, 3)   # under 4 windows a side: no halves
    t = S.log_window_test(list(b), list(a), alpha=0.05, min_change=0)
    assert t.p == pytest.approx(stats.ttest_ind(np.log(a), np.log(b), equal_var=False).pvalue, rel=1e-9)
    b, a = rng.lognormal(10, 0.1, 8), rng.lognormal(10.1, 0.1, 8)
    t = S.log_window_test(list(b), list(a), alpha=0.05, min_change=0)
    lb, la = np.log(b), np.log(a)
    drift = np.mean([(x[:4].mean() - x[4:].mean()) ** 2 for x in (lb, la)])
    var = lb.var(ddof=1) / 8 + la.var(ddof=1) / 8 + drift
    df = var ** 2 / ((lb.var(ddof=1) / 8) ** 2 / 7 + (la.var(ddof=1) / 8) ** 2 / 7 + drift ** 2 / 4)
    d = la.mean() - lb.mean()
    assert t.p == pytest.approx(2 * stats.t.sf(abs(d) / math.sqrt(var), df), rel=1e-9)
    assert math.log1p(t.interval[1]) - d == pytest.approx(stats.t.isf(0.025, df) * math.sqrt(var), rel=1e-7)


def test_runs_test_one_run_a_side_is_normal_and_several_are_pooled_student_t():
    t = S.runs_test([(100.0, 0.01)], [(130.0, 0.02)], alpha=0.05, min_change=0)
    z = math.log(1.3) / math.sqrt(0.03)
    assert t.p == pytest.approx(2 * stats.norm.sf(z), rel=1e-9)
    assert t.interval[0] == pytest.approx(math.expm1(math.log(1.3) - stats.norm.isf(0.025) * math.sqrt(0.03)))
    rng = np.random.default_rng(3)
    b, a = rng.lognormal(5, 0.05, 4), rng.lognormal(5.05, 0.05, 3)
    t = S.runs_test([(x, 9.0) for x in b], [(x, 9.0) for x in a], alpha=0.05, min_change=0)   # variances unused
    assert t.p == pytest.approx(stats.ttest_ind(np.log(a), np.log(b), equal_var=True).pvalue, rel=1e-9)
    # several runs before, one after: the one run judged against the spread between the others
    t = S.runs_test([(x, 0.0) for x in b], [(a[0], 0.0)], alpha=0.05, min_change=0)
    lb = np.log(b)
    se = lb.std(ddof=1) * math.sqrt(1 + 1 / 4)
    assert t.p == pytest.approx(2 * stats.t.sf(abs(math.log(a[0]) - lb.mean()) / se, 3), rel=1e-9)


def test_a_sure_change_under_the_floor_is_not_claimed():
    t = S.runs_test([(100.0, 1e-8)], [(102.0, 1e-8)])       # 2 %, certain
    assert t.p < 1e-6 and not t.significant and "smallest change claimed" in t.reason
    assert S.runs_test([(100.0, 1e-8)], [(102.0, 1e-8)], min_change=0.01).significant
    same = S.runs_test([(100.0, 0.0)], [(100.0, 0.0)])
    assert same.p == 1 and not same.significant
    assert S.paired_test([0.1, 0.2]).basis == "none"          # two turns: nothing to test


# ------------------------------------------------------------- synthetic snapshots on a wandering machine
def speeds(rng, seconds, step=0.05):
    """The machine's speed factor every `step` seconds, the way the diff models it for one run a side: log speed
    an AR(1) process with a standard deviation of MACHINE_SPREAD and a correlation time of MACHINE_MEMORY_S, about
    a mean that drifts from run to run by MACHINE_DRIFT."""
    n = max(1, int(seconds / step))
    rho = math.exp(-step / (S.MACHINE_MEMORY_S / 2))   # integrated correlation time 0.4 s
    x = np.empty(n)
    x[0] = rng.normal(0, S.MACHINE_SPREAD)
    for k in range(1, n):
        x[k] = rho * x[k - 1] + rng.normal(0, S.MACHINE_SPREAD * math.sqrt(1 - rho * rho))
    return np.exp(x + rng.normal(0, S.MACHINE_DRIFT))


def stage(path, per_call_ns, speed, calls_each, rng):
    """A stage whose calls cost `per_call_ns` of CPU times the machine's speed then and the stage's own luck in
    this process (its layout: 2.5 % on the log scale, the spread measured between processes), spread 5 % between
    calls, wall = CPU (no preemption)."""
    luck = rng.lognormal(0, 0.025)
    times = np.concatenate([per_call_ns * luck * f * rng.lognormal(0, 0.05, calls_each) for f in speed]).astype(int)
    hist = {}
    for v in times:
        hist[_hist.index(int(v))] = hist.get(_hist.index(int(v)), 0) + 1
    total = int(times.sum())
    return StageStats(tuple(path.split("/")), len(times), 0, total, total, int(times.min()), int(times.max()), total,
                      total, len(times), hist, items={"tokens": {"total": 8 * len(times), "calls": len(times)}})


def plain_run(rng, model_ns, seconds=30.0, calls_each=2):
    speed = speeds(rng, seconds)
    stages = [stage("request", 400_000, speed, calls_each, rng), stage("request/tokenize", 20_000, speed, calls_each, rng),
              stage("request/model", model_ns, speed, calls_each, rng), stage("request/alloc", 40_000, speed, calls_each, rng)]
    return Snapshot(stages, {"start_time": 0.0, "end_time": seconds, "duration_ns": int(seconds * 1e9)})


def test_one_run_a_side_on_a_wandering_machine():
    rng = np.random.default_rng(11)
    same = [(plain_run(rng, 200_000), plain_run(rng, 200_000)) for _ in range(100)]
    # identical code, 100 pairs of plain runs: at alpha = 1 % over all tests, at most 6 flagged
    # (P(X >= 7) < 0.001 for X ~ Binomial(100, 0.01)); with tokenize as the reference too
    assert sum(any(r.significant for r in diff(b, a).rows) for b, a in same) <= 6
    assert sum(any(r.significant for r in diff(b, a, reference="request/tokenize").rows) for b, a in same) <= 6
    twice = [diff(plain_run(rng, 200_000), plain_run(rng, 400_000)) for _ in range(20)]
    assert sum(d.row("request/model").judgement == "slower" for d in twice) >= 18   # twice the work: seen
    # 30 % more work is within what the machine moves between two plain runs; the stages whose code did not
    # change take the machine out (their common change), as a named reference stage does; each stage's own luck
    # in a process (2.5 % a run) leaves the change beyond the interval in about 97 % of pairs
    slower = [(plain_run(rng, 200_000), plain_run(rng, 260_000)) for _ in range(20)]
    assert sum(diff(b, a).row("request/model").judgement == "slower" for b, a in slower) >= 18
    assert sum(diff(b, a, reference="request/tokenize").row("request/model").judgement == "slower"
               for b, a in slower) >= 19
    # without the common change (its members, the stages that hold no other, too few) the machine's wandering
    # hides it
    alone = [(Snapshot(b.stages[:3], b.meta), Snapshot(a.stages[:3], a.meta)) for b, a in slower]
    assert sum(diff(b, a).row("request/model").judgement == "slower" for b, a in alone) <= 10


def test_the_variance_of_one_run_follows_its_length():
    rng = np.random.default_rng(5)
    s = plain_run(rng, 200_000, seconds=1.0, calls_each=50)["request/model"]
    assert S.machine_variance(1.0) == pytest.approx(0.27 ** 2 * 0.4 + 0.07 ** 2)
    assert S.machine_variance(100.0) == pytest.approx(0.27 ** 2 * 0.004 + 0.07 ** 2)
    assert S.machine_variance(None) == S.machine_variance(0.1) == pytest.approx(0.27 ** 2 + 0.07 ** 2)
    # the calls' spread: the standard deviation a normal distribution has for the quartiles of log call time
    logs = np.log(np.repeat([_hist.midpoint(i) for i in s.hist], list(s.hist.values())))
    q1, q3 = np.percentile(logs, [25, 75])
    assert spread(s) == pytest.approx((q3 - q1) / 1.349, abs=0.01)
    assert run_variance(s, "cpu", 0.01) == pytest.approx(0.01 + spread(s) ** 2 / s.calls)
    # counted work: the calls' spread over their number and the Poisson variance of the count, no machine
    assert run_variance(s, "item:tokens", 0.01) == pytest.approx(spread(s) ** 2 / s.calls + 1 / (8 * s.calls + 0.5))


def chunked(rng, model_ns, turns, calls, interleave=True, drift=0.3):
    """Both sides in chunks of `calls`, recorded in turns (or all before, then all after), merged per side, on a
    machine whose speed drifts by `drift` over the recording and changes 3 % from chunk to chunk."""
    order = [side for k in range(turns) for side in ((0, 1) if k % 2 == 0 else (1, 0))]
    if not interleave:
        order.sort()
    parts, t = ([], []), 0.0
    for k, side in enumerate(order):
        f = np.exp([drift * k / len(order) + rng.normal(0, 0.03)])
        stages = [stage("request", 400_000, f, calls, rng), stage("request/model", model_ns[side], f, calls, rng)]
        parts[side].append(Snapshot(stages, {"start_time": t, "end_time": t + 0.01, "pid": 1}))
        t += 0.01
    return parts[0][0].merge(*parts[0][1:]), parts[1][0].merge(*parts[1][1:])


def test_turns_cancel_the_machine_and_see_ten_percent():
    rng = np.random.default_rng(2)
    same = [diff(*chunked(rng, (200_000, 200_000), 20, 20)) for _ in range(40)]
    assert {d.basis for d in same} == {"turns"}
    assert sum(any(r.significant for r in d.rows) for d in same) <= 3     # P(X >= 4) < 0.01, Binomial(40, 0.01)
    slower = [diff(*chunked(rng, (200_000, 220_000), 20, 20)) for _ in range(20)]
    assert sum(d.row("request/model").judgement == "slower" for d in slower) >= 18
    for d in slower:
        t = d.row("request/model").tests["wall"]
        assert t.interval[0] < 0.1 < t.interval[1] or t.interval[0] > 0.03     # the 10 % inside, or beyond floor


def test_windows_take_the_drift_into_account():
    rng = np.random.default_rng(4)
    # the machine slows by 20 % over the recording, all before first: the drift each side shows between its
    # halves widens the intervals, so the sides' difference (the drift) is not called a change
    drifting = [diff(*chunked(rng, (200_000, 200_000), 12, 20, interleave=False, drift=0.2)) for _ in range(20)]
    assert {d.basis for d in drifting} == {"windows"}
    assert sum(any(r.significant for r in d.rows) for d in drifting) <= 1
    slower = [diff(*chunked(rng, (200_000, 400_000), 12, 20, interleave=False, drift=0.0)) for _ in range(10)]
    assert sum(d.row("request/model").judgement == "slower" for d in slower) >= 9


def test_bonferroni_over_every_test_of_the_comparison():
    rng = np.random.default_rng(8)
    d = diff(plain_run(rng, 200_000), plain_run(rng, 200_000))
    m = sum(1 for r in d.rows for k, t in r.judged)
    assert d.tests == m == 4 * 2                    # CPU and wall of four stages (items: the same everywhere)
    assert d.row("request/model").tests["item:tokens"].basis == "none"
    for r in d.rows:
        for t in r.tests.values():
            assert t.level == pytest.approx(1 - 0.01 / m)


# ------------------------------------------------------------------- detectable and what would show a rise
def test_detectable_is_the_rise_whose_interval_just_clears_the_floor():
    v = 0.04                                                   # each run's variance of its log
    t = S.runs_test([(1.0, v)], [(1.0, v)], alpha=0.01, min_change=0.03)
    z = stats.norm.ppf(1 - 0.005)
    assert t.detectable == pytest.approx(math.exp(z * math.sqrt(2 * v)) * 1.03 - 1, rel=1e-6)
    at = S.runs_test([(1.0, v)], [(1 + t.detectable + 1e-6, v)], alpha=0.01, min_change=0.03)
    below = S.runs_test([(1.0, v)], [(1 + t.detectable - 1e-6, v)], alpha=0.01, min_change=0.03)
    assert at.significant and not below.significant


def runs_with_spread(m, var):
    """m runs whose logs have mean 0 and sample variance `var` exactly."""
    x = np.random.default_rng(m).normal(size=m)
    x = (x - x.mean()) / x.std(ddof=1) * math.sqrt(var)
    return [(math.exp(v), 0.0) for v in x]


def test_a_spread_pooled_with_siblings_and_a_floor_decide_as_scipy_says():
    xb, xa = runs_with_spread(3, 0.01), runs_with_spread(3, 0.01)      # its own spread between runs: 0.01, 4 df
    k = 1 / 3 + 1 / 3
    t = S.runs_test(xb, xa, alpha=0.01, min_change=0.03, pooled=(0.0004 * 12, 12))   # with siblings: 0.0004, 12 df
    assert t.df == 12 and t.detectable == pytest.approx(
        math.exp(stats.t.ppf(0.995, 12) * math.sqrt(0.0004 * k)) * 1.03 - 1, rel=1e-6)
    own = S.runs_test(xb, xa, alpha=0.01, min_change=0.03, pooled=(0.0, 2))   # fewer df than its own: not taken
    assert own.df == 4 and own.detectable == pytest.approx(
        math.exp(stats.t.ppf(0.995, 4) * math.sqrt(0.01 * k)) * 1.03 - 1, rel=1e-6)
    # a floor wider than the measured spread's interval decides, as a normal test on it
    f = S.runs_test(xb, xa, alpha=0.01, min_change=0.03, pooled=(0.0004 * 12, 12), stray=0.03 ** 2)
    assert f.df == math.inf and f.detectable == pytest.approx(
        math.exp(stats.norm.ppf(0.995) * 0.03 * math.sqrt(k)) * 1.03 - 1, rel=1e-6)
    assert S.runs_test(xb, xa, alpha=0.01, min_change=0.03, stray=0.03 ** 2).df == 4   # narrower than its own
    # the runs a side that would show a rise keep the siblings' degrees of freedom
    m, _ = S.needed(t, 0.06)
    for runs, shows in ((m, True), (m - 1, False)):
        df = 2 * runs - 2 + 8
        u = S.runs_test(runs_with_spread(runs, 0.0004), runs_with_spread(runs, 0.0004), alpha=0.01,
                        min_change=0.03, pooled=(0.0004 * df, df))
        assert (u.detectable <= 0.06) is shows, (runs, u.detectable)


@pytest.mark.parametrize("target", [0.1, 0.2])
def test_runs_needed_are_the_fewest_whose_measured_spread_shows_the_target(target):
    v = 0.04
    one = S.runs_test([(1.0, v)], [(1.0, v)], alpha=0.002, min_change=0.03)   # one run a side: a 99.8 % test
    m, calls = S.needed(one, target)
    assert calls is None                                      # the test says nothing of its calls
    for k, shows in ((m, True), (m - 1, False)):              # k runs a side, each side's spread the one run's
        t = S.runs_test(runs_with_spread(k, v), runs_with_spread(k, v), alpha=0.002, min_change=0.03)
        assert (t.detectable <= target) is shows, (k, t.detectable)
    assert S.needed(one, 0.02) == (None, None)                # within min_change: no number of runs
    # 99.9 % of its variance the calls' spread: k times the calls leave 0.1 % + 99.9 % / k of it, which shows target
    k = S.needed(S.Significance(**{**one.__dict__, "calls_share": 0.999}), target)[1]
    assert math.expm1(one.half() * math.sqrt(0.001 + 0.999 / k) + math.log1p(0.03)) == pytest.approx(target)
    assert S.needed(S.Significance(**{**one.__dict__, "calls_share": 0.9}), target)[1] is None   # 10 % is too much
