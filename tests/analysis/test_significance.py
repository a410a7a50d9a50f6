"""Is a change beyond noise?  The statistics against scipy, then the whole diff on
real workloads: identical code measured twice is rarely flagged, a slower one is."""
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

import instrument
from instrument import cli, histogram as _hist
from instrument.analysis import significance as S
from instrument.analysis.diff import diff
from instrument.exporters import table
from snapfactory import snap, st

MS = 1_000_000


def hist_of(values):
    h = {}
    for v in values:
        h[_hist.index(int(v))] = h.get(_hist.index(int(v)), 0) + 1
    return h


def midpoints(h):
    return np.repeat([_hist.midpoint(i) for i in h], list(h.values()))


# ------------------------------------------------------------- the statistics
@pytest.mark.parametrize("df", [1, 2.5, 4, 9, 30, 400])
def test_student_t_matches_scipy(df):
    for t in (0.05, 0.7, 1.9, 3.3, 8.0):
        assert S.t_sf(t, df) == pytest.approx(stats.t.sf(t, df), rel=1e-9, abs=1e-14)
        assert S.t_sf(-t, df) == pytest.approx(stats.t.sf(-t, df), rel=1e-9)
    for q in (0.25, 0.025, 0.005, 1e-4):
        assert S.t_ppf(q, df) == pytest.approx(stats.t.isf(q, df), rel=1e-7)
    assert S.normal_ppf(0.005) == pytest.approx(stats.norm.isf(0.005), rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_rank_test_on_histograms_matches_scipy_on_the_bucketed_values(seed):
    rng = np.random.default_rng(seed)
    b = hist_of(rng.lognormal(11, 0.4, 800))
    a = hist_of(rng.lognormal(11, 0.4, 600) * (1 + 0.02 * seed))
    mb, ma = midpoints(b), midpoints(a)
    ref = stats.mannwhitneyu(ma, mb, method="asymptotic", use_continuity=True)
    u, _, p = S.mann_whitney(b, a)
    assert u == ref.statistic and p == pytest.approx(ref.pvalue, rel=1e-9)
    sig = S.rank_test(b, a, alpha=0.05, min_change=0)
    pairs = np.sort((np.log(ma)[:, None] - np.log(mb)[None, :]).ravel())
    k = len(pairs) // 2                                   # Hodges-Lehmann: the median pairwise difference
    assert pairs[k - 1] - 1e-9 <= math.log1p(sig.estimate) <= pairs[k] + 1e-9
    lo, hi = sig.interval
    assert lo <= sig.estimate <= hi
    # the interval and the test agree (a bound on a tie at exactly no change counts as including it)
    assert (lo > 1e-9 or hi < -1e-9) == (p < 0.05) or abs(p - 0.05) < 0.01


def test_signed_rank_test_matches_scipy_exact():
    rng = np.random.default_rng(3)
    for n, shift in ((8, 0.0), (12, 0.03), (20, 0.01), (30, -0.02)):
        d = rng.normal(shift, 0.02, n)
        sig = S.paired_test(list(d), alpha=0.05, min_change=0)
        ref = stats.wilcoxon(d, method="exact")
        assert sig.p == pytest.approx(ref.pvalue, rel=1e-9)
        walsh = [(d[i] + d[j]) / 2 for i in range(n) for j in range(i, n)]
        assert math.log1p(sig.estimate) == pytest.approx(np.median(walsh), abs=1e-12)
    d = np.round(rng.normal(0.01, 0.02, 200), 3)          # many pairs, with ties: the normal approximation
    sig = S.paired_test(list(d), alpha=0.05, min_change=0)
    ref = stats.wilcoxon(d, method="approx", correction=True, zero_method="wilcox")
    assert sig.p == pytest.approx(ref.pvalue, rel=1e-6)
    assert sig.interval[0] < math.expm1(np.median(d)) < sig.interval[1]


def test_identical_values_are_never_a_change_and_constant_shift_always_is():
    same = {_hist.index(5 * MS): 100}
    assert not S.rank_test(same, same).significant and S.rank_test(same, same).p == 1
    slower = {_hist.index(7 * MS): 100}
    r = S.rank_test(same, slower)
    assert r.significant and r.direction == 1 and r.estimate == pytest.approx(0.4, abs=0.02)
    assert not S.rank_test({1: 1}, {2: 1}).significant      # one call a side: untested, not a finding
    assert S.rank_test({1: 1}, {2: 1}).basis == "none"


def test_min_change_floor():
    b = {_hist.index(10 * MS): 1000}
    a = {_hist.index(int(10.2 * MS)): 1000}    # 2 % slower, no spread at all: certain, but under the floor
    assert S.rank_test(b, a, min_change=0).significant
    r = S.rank_test(b, a)
    assert not r.significant and "smallest change claimed" in r.reason


# -------------------------------------------------------- real workloads
def _work(calls, iterations):
    spin = instrument.stage("spin")   # the stage of the backend in use
    for _ in range(calls):
        with spin:
            x = 0
            for i in range(iterations):
                x += i * i


def in_turns(slower=1.0, turns=40, calls=200, base=400):
    """Before and after taking turns, `turns` chunks each, as instrument demo runs its variants."""
    parts = ([], [])
    for k in range(turns):
        order = ((0, int(base * 1.0)), (1, int(base * slower)))   # bounds made alike
        for side, iterations in order if k % 2 == 0 else order[::-1]:   # neither side always goes first
            instrument.reset()
            _work(calls, iterations)
            parts[side].append(instrument.snapshot())
    return parts[0][0].merge(*parts[0][1:]), parts[1][0].merge(*parts[1][1:])


def test_identical_workloads_in_turns_are_rarely_flagged():
    _work(1000, 400)   # warm
    trials, flagged, seen = 20, 0, []
    for _ in range(trials):
        d = diff(*in_turns())
        t = d.row("spin").significance
        assert t.basis == "turns" and t.n == (40, 40)
        flagged += t.significant
        seen.append(t.reason)
    assert flagged <= 1, seen          # at least 95 % of identical pairs are called noise


def _flagged(slower, trials, turns, tests=None):
    _work(300, 400)
    hits = []
    for _ in range(trials):
        d = diff(*in_turns(slower, turns=turns))
        t = d.row("spin").significance
        hits.append(t.significant and t.direction == 1 and d.significant)
        if t.significant:
            assert t.interval[0] > 0.03 and t.estimate > 0.05
        if tests is not None:
            tests.append(t)
    return hits


def test_thirty_percent_slower_is_always_flagged(backend):
    tests = []
    hits = _flagged(1.3, 5, 24, tests)
    # flagged in every trial unless the windows this machine gave spread wider than the slowdown itself
    # (a loaded machine can stall one side's window): then the test still points slower, its 99 % interval
    # starting under the 3 % floor and wider than the gap from that floor to the 30 % given
    for hit, t in zip(hits, tests):
        assert hit or (t.estimate > 0.05 and t.interval[0] < 0.03 and t.interval[1] - t.interval[0] > 0.27), \
            [x.reason for x in tests]
    assert sum(hits) >= 4, [x.reason for x in tests]


def test_ten_percent_slower_is_flagged():
    tests = []
    hits = _flagged(1.1, 5, 40, tests)
    # 5 of 5 on the idle 2-core VM.  A loaded machine stalls windows and widens the spread: a trial not
    # flagged must then still be unsure rather than wrong, its 99 % interval reaching above the 3 % floor
    # (a slowdown not excluded) and down under it
    for hit, t in zip(hits, tests):
        assert hit or (t.interval[1] > 0.03 and t.interval[0] < 0.03), [x.reason for x in tests]
    assert sum(hits) >= 1, [x.reason for x in tests]


def single_windows(slower=1.0, rounds=40, calls=50, base=400):
    """One window a side: the two workloads alternate every `calls` calls in one recording, each
    under its own stage; each side's stage is then given the common path."""
    a, b = instrument.stage("side_a"), instrument.stage("side_b")
    instrument.reset()
    for k in range(rounds):
        for st_, it in ((a, int(base * 1.0)), (b, int(base * slower)))[:: 1 if k % 2 == 0 else -1]:
            for _ in range(calls):
                with st_:
                    x = 0
                    for i in range(it):
                        x += i * i
    s = instrument.snapshot()
    side = [instrument.Snapshot([replace(s[name], path=("spin",))], s.meta) for name in ("side_a", "side_b")]
    return side


def test_single_windows_use_the_rank_test():
    _work(300, 400)
    flagged = 0
    for _ in range(10):
        d = diff(*single_windows())
        assert d.significance.basis == "calls"
        flagged += d.significant
    assert flagged <= 1
    for _ in range(3):
        d = diff(*single_windows(1.3))
        assert d.significance.basis == "calls" and d.significance.direction == 1


# ----------------------------------------------------------- what is shown
def test_headline_json_csv_and_table_say_noise_or_change(tmp_path):
    before, after = in_turns(turns=10, calls=100)
    d = diff(before, after, min_change=0.5)            # nothing real can clear a 50 % floor
    assert "; within noise: typical call " in table.headline(d) and not d.significant
    j = json.loads(table.render_diff(d, "json"))
    assert j["significant"] is False and len(j["interval"]) == 2 and j["significance"]["basis"] == "turns"
    assert j["rows"][0]["significant"] is False and j["rows"][0]["interval"][0] < j["rows"][0]["interval"][1]
    text = table.render_diff(d)
    row = next(l for l in text.splitlines() if l.startswith("spin "))
    assert row.split()[-1] == "~noise" and "~" in row.split()[8]      # the mean Δ% marked as noise
    # a 50 % slower side: every form says what the test of the windows measured, and the windows a loaded
    # machine gives can hide even that; the forms are checked on each try, until one is beyond noise
    tries = []
    for _ in range(5):
        slow = diff(*in_turns(1.5, turns=10, calls=100))
        t = slow.row("spin").significance
        tries.append(t.reason)
        row = next(l for l in table.render_diff(slow).splitlines() if l.startswith("spin "))
        rows = list(__import__("csv").DictReader(__import__("io").StringIO(table.render_diff(slow, "csv"))))
        assert rows[0]["significant"] == str(t.significant) and slow.significant == t.significant
        if not t.significant:
            assert "; within noise: typical call " in table.headline(slow) and row.split()[-1] == "~noise"
            continue
        assert "; beyond noise: typical call +" in table.headline(slow) and row.split()[-1] == "slower"
        assert float(rows[0]["interval_low_pct"]) > 3
        break
    assert tries and t.significant, tries


def test_counters_and_cpu_only_tested_with_windows():
    one = diff(snap(st("r", 100, 10 * MS, counters={"context-switches": {"total": 34}})),
               snap(st("r", 100, 10 * MS, counters={"context-switches": {"total": 15}})))
    r = one.row("r")
    assert r.counter_significance["context-switches"].basis == "none" and r.cpu_significance.basis == "none"
    assert "~context-switches: 34 → 15 (−55.9%, untested: one window)" in table.render_diff(one)
    before, after = in_turns(turns=10, calls=100)
    r = diff(before, after).row("spin")
    assert r.cpu_significance.basis == "windows"
    for name, t in r.counter_significance.items():
        assert t.basis in ("windows", "none"), name


def write(tmp_path, before, after):
    a, b = tmp_path / "before.json", tmp_path / "after.json"
    before.save(a)
    after.save(b)
    return str(a), str(b)


def test_fail_if_slower_fails_only_beyond_noise(tmp_path, capsys):
    _work(300, 400)
    a, b = write(tmp_path, *in_turns(turns=16, calls=100))
    assert cli.main(["diff", a, b, "--fail-if-slower", "0"]) in (0, 1)   # an identical pair: the test decides
    capsys.readouterr()
    a, b = write(tmp_path, *in_turns(1.4, turns=16, calls=100))
    assert cli.main(["diff", a, b, "--fail-if-slower", "10"]) == 1
    assert "beyond noise" in capsys.readouterr().err
    assert cli.main(["diff", a, b, "--fail-if-slower", "10", "--min-change", "80"]) == 0   # the floor: not claimed
    assert "not beyond noise" in capsys.readouterr().err
    # mean 20 % slower from a few long calls, typical call unchanged: noise, not a slowdown
    rng = np.random.default_rng(1)
    base = [int(v) for v in rng.normal(10 * MS, 0.2 * MS, 2000)]
    tail = [v + 50 * MS if k < 40 else v for k, v in enumerate(base)]
    a, b = write(tmp_path, snap(st("req", 0, 0, values=base)), snap(st("req", 0, 0, values=tail)))
    assert cli.main(["diff", a, b, "--fail-if-slower", "5"]) == 0
    err = capsys.readouterr().err
    assert "slower per call" in err and "not beyond noise" in err
    a, b = write(tmp_path, snap(st("req", 0, 0, values=base)), snap(st("req", 0, 0, values=[int(v * 1.3) for v in base])))
    assert cli.main(["diff", a, b, "--fail-if-slower", "5"]) == 1
    assert cli.main(["diff", a, b, "--alpha", "0.9"]) == 2                  # refused with what is allowed
    assert "argument --alpha: must be a number from 1e-09 to 0.5, got '0.9'" in capsys.readouterr().err   # diff_alpha's parser


def test_windows_survive_save_and_load(tmp_path):
    before, after = in_turns(turns=9, calls=50)
    a, b = write(tmp_path, before, after)
    again = diff(instrument.Snapshot.load(a), instrument.Snapshot.load(b))
    assert again.significance == diff(before, after).significance
    assert len(instrument.Snapshot.load(a)["spin"].windows) == 9


def test_unbounded_interval_is_null_in_json():
    t = S.paired_test([0.1] * 8, alpha=1e-4, min_change=0)   # 8 pairs cannot reach 99.99 %
    assert t.interval == (-1.0, math.inf) and t.interval_list() == [-1.0, None] and not t.significant
    json.dumps(t.to_dict(), allow_nan=False)
