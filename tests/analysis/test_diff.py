"""The diff on snapshots with known numbers: rows, the basis and why, the machine line, what judges a
stage (CPU, counted work and items before wall time), the CI gate and its JSON summary, the forms."""
import csv
import io
import json
import math
from dataclasses import replace
from statistics import NormalDist

import pytest

from instrument import cli
from instrument.analysis import diff as D
from instrument.analysis import machine as M
from instrument.analysis import significance as S
from instrument.exporters import DIFF
from instrument.exporters.format import headline, legend
from instrument.snapshot import Snapshot
from snapfactory import snap, st

MS = 1_000_000


def pair(after_calls=100, after_ms=18.1):
    before = snap(st("request", 100, 25 * MS, cpu_ns=2000 * MS, counters={"instructions": {"total": 1_000_000}}),
                  st("request/tokenize", 100, 3 * MS), st("request/model", 100, 20 * MS),
                  st("request/legacy", 10, 1 * MS), st("health", 5, MS))
    after = snap(st("request", after_calls, int(after_ms * MS), cpu_ns=15 * MS * after_calls,
                    counters={"instructions": {"total": 8_000 * after_calls}}),
                 st("request/tokenize", after_calls, 3 * MS), st("request/model", after_calls, 14 * MS),
                 st("request/cache", 20, 2 * MS), st("health", 5, MS))
    return before, after


def test_headline_from_the_top_stage_judged_on_load_free_figures_first():
    d = D.diff(*pair())
    # two plain runs: CPU time −25 % is within what a machine moves between runs; 20 % fewer instructions is not
    assert headline(d).startswith("request: 25.0 ms → 18.1 ms (−27.6%); faster beyond noise: instructions per "
                                        "call −20.0% (99.83% interval ")
    assert d.stage == ("request",) and d.change == pytest.approx(-0.276) and d.change_of == "mean"
    r = d.row("request")
    assert r.decision[0] == "instructions" and r.judgement == "faster"
    # judged by some figures only: its time is within noise, a figure it does not have is untested
    assert r.judgement_of(("cpu", "wall")) == "within noise" and r.judgement_of(("instructions",)) == "faster"
    assert r.judgement_of(("page-faults",)) == "untested"
    cpu = r.tests["cpu"]
    assert cpu.estimate == pytest.approx(-0.25) and not cpu.significant and cpu.interval[1] > -0.03


def test_headline_adds_totals_when_calls_differ():
    d = D.diff(*pair(after_calls=50))
    assert headline(d).startswith("request: 25.0 ms → 18.1 ms (−27.6%) per call; total 2.50 s → 905 ms "
                                        "(−63.8%) over 100 → 50 calls; faster beyond noise")


def test_rows_union_sorted_by_absolute_change_with_one_sided_stages():
    d = D.diff(*pair())
    paths = [r.path for r in d.rows]
    assert set(paths) == {("request",), ("request", "tokenize"), ("request", "model"), ("request", "legacy"),
                          ("request", "cache"), ("health",)}
    assert paths[:2] == [("request",), ("request", "model")]          # −690 ms, −600 ms
    by = {r.path: r for r in d.rows}
    assert by[("request", "legacy")].status == "only before" and by[("request", "cache")].status == "only after"
    assert by[("request", "legacy")].judgement == "untested"
    req = by[("request",)]
    assert req.metrics["total"].delta == -690 * MS and req.metrics["total"].ratio == pytest.approx(0.724)
    assert req.metrics["p50"].before == 25 * MS and req.metrics["p99"].after == 18.1 * MS
    assert req.metrics["cpu"].ratio == pytest.approx(0.75)
    assert req.counters["instructions"].ratio == pytest.approx(0.8)
    assert by[("health",)].judgement == "within noise" and by[("request", "model")].judgement == "within noise"


def test_render_formats():
    d = D.diff(*pair())
    t = DIFF.render(d)
    lines = t.splitlines()
    assert lines[0] == headline(d)
    assert lines[1] == "basis: runs, the strongest these snapshots allow: one run a side (two plain runs)"
    assert lines[2] == "" and lines[3].startswith("stage ")   # how the basis tests, and alike machines: below
    assert "\nbasis in full: each figure per call with its spread" in t
    assert "\nmachine: the snapshots do not describe their machines" in t
    req = next(l for l in lines if l.startswith("request "))
    assert "2500.0" in req and "1810.0" in req and "~−25.0%" in req and req.split()[-1] == "faster"
    assert "request/legacy (only before)" in t and "request/cache (only after)" in t
    assert "    faster beyond noise: instructions per call −20.0% (" in t
    rows = list(csv.DictReader(io.StringIO(DIFF.render(d, "csv"))))
    r = next(x for x in rows if x["path"] == "request/model")
    assert float(r["total_before_ns"]) == 2000 * MS and float(r["total_after_ns"]) == 1400 * MS
    assert r["judgement"] == "within noise" and r["wall_significant"] == "False" and r["cpu_significant"] == ""
    j = json.loads(DIFF.render(d, "json"))
    assert j["headline"] == headline(d) and j["rows"][0]["total_ns"]["delta"] == -690 * MS
    assert j["basis"] == "runs" and j["machine"]["differed"] is False
    assert DIFF.render(d, "markdown").startswith("**request: 25.0 ms")
    with pytest.raises(ValueError):
        DIFF.render(d, "xml")


def test_headline_when_the_top_stage_is_on_one_side():
    d = D.diff(snap(st("old", 3, 10 * MS)), snap(st("new", 1, MS)))
    assert headline(d) == "old: only before (30.0 ms total)" and d.change is None
    assert d.tests == 0 and legend(d)[2].endswith("; no figure of any stage could be tested")


# ------------------------------------------------------------------------ the basis
def chunks(per_call_ns, times, pid=1):
    """One snapshot per (start, end): a stage of 50 calls of per_call_ns each, merged.  `pid` None: each
    snapshot a process of its own."""
    parts = [Snapshot([st("request", 50, per_call_ns, cpu_ns=50 * per_call_ns)],
                      {"pid": pid or 100 + k, "start_time": s, "end_time": e, "duration_ns": int((e - s) * 1e9)})
             for k, (s, e) in enumerate(times)]
    return parts[0].merge(*parts[1:])


def test_the_basis_is_the_strongest_the_snapshots_allow_and_says_why():
    turns_b = chunks(10 * MS, [(2 * k, 2 * k + 1) for k in range(10)])
    turns_a = chunks(11 * MS, [(2 * k + 1, 2 * k + 2) for k in range(10)])
    d = D.diff(turns_b, turns_a)
    assert d.basis == "turns" and "alternate in time" in d.basis_reason and "10 pairs" in d.basis_reason
    assert d.row("request").tests["wall"].n == (10, 10) and d.row("request").judgement == "slower"
    seq_b = chunks(10 * MS, [(k, k + 1) for k in range(5)])
    seq_a = chunks(11 * MS, [(k, k + 1) for k in range(10, 15)])
    d = D.diff(seq_b, seq_a)
    assert d.basis == "windows" and "(5 and 5) not taken in turns" in d.basis_reason
    d = D.diff(seq_b, seq_a, basis="runs")
    assert d.basis == "runs" and d.basis_reason.startswith("runs, as asked: 5 runs before, 5 after")
    assert not d.warnings and d.requested_basis == "runs"
    # the same windows, each a process of its own (separate runs, merged per side): the spread between them is
    # measured on the runs basis; the windows basis holds where asked
    sep_b = chunks(10 * MS, [(k, k + 1) for k in range(5)], pid=None)
    sep_a = chunks(11 * MS, [(k, k + 1) for k in range(10, 15)], pid=None)
    d = D.diff(sep_b, sep_a)
    assert d.basis == "runs" and d.basis_reason == ("runs, the strongest these snapshots allow: 5 runs before, 5 "
                                                    "after, each a process of its own: the spread between runs "
                                                    "measured from them (a pooled t-test)")
    assert d.row("request").tests["wall"].n == (5, 5)
    assert D.diff(sep_b, sep_a, basis="windows").basis == "windows"
    # separate processes that took turns: turns
    d = D.diff(chunks(10 * MS, [(2 * k, 2 * k + 1) for k in range(10)], pid=None),
               chunks(11 * MS, [(2 * k + 1, 2 * k + 2) for k in range(10)], pid=None))
    assert d.basis == "turns"
    # one process seen again in a later window: windows of one recording, not separate runs
    mixed = chunks(10 * MS, [(k, k + 1) for k in range(4)], pid=None).merge(chunks(10 * MS, [(5, 6)], pid=100))
    assert D.diff(mixed, seq_a).basis == "windows"


def test_a_basis_that_cannot_hold_is_warned_about_never_silent():
    b, a = pair()
    d = D.diff(b, a, basis="turns")
    assert d.basis == "runs" and d.requested_basis == "turns"
    assert d.warnings == ("basis turns cannot hold: the windows do not alternate in time (0 of 1 make turns; 8+ "
                          "pairs taking in 80 % of each side are needed); judged on runs instead",)
    assert d.basis_reason.startswith("runs (asked for turns, which cannot hold): one run a side")
    assert "warning: basis turns cannot hold" in DIFF.render(d)
    with pytest.raises(ValueError, match="basis must be one of turns, windows, runs, got 'calls'"):
        D.diff(b, a, basis="calls")
    # a stage present in too few windows of a turns comparison is left untested, not judged another way
    tb = chunks(10 * MS, [(2 * k, 2 * k + 1) for k in range(10)]).merge(
        Snapshot([st("rare", 5, MS)], {"start_time": 100, "end_time": 101}))
    ta = chunks(10 * MS, [(2 * k + 1, 2 * k + 2) for k in range(10)]).merge(
        Snapshot([st("rare", 5, MS)], {"start_time": 102, "end_time": 103}))
    rare = D.diff(tb, ta).row("rare")
    assert rare.judgement == "untested" and "do not take turns" in rare.tests["wall"].reason


def test_processes_recorded_together_are_one_run():
    workers = chunks(10 * MS, [(0, 10), (0.5, 10.2), (1, 9.5)], pid=7)        # three workers at once
    assert len(D.runs_of(workers["request"].all_windows())) == 1
    d = D.diff(workers, chunks(10 * MS, [(20, 30), (20.1, 30)], pid=8))
    assert d.basis == "runs" and "one run a side" in d.basis_reason


# ------------------------------------------------------------------------ the machine
def loaded(s, waiting, covered=None):
    """Stage `s` with `waiting` of its running time in the run queue."""
    run = s.wall_total if covered is None else covered
    return replace(s, covered_run=run, runqueue={"total": waiting * run, "self": waiting * run, "var": 0.0,
                                                 "var_self": 0.0, "reads": s.calls})


def run(wall_ms, cpu_ms, waiting, reference=None, calls=400):
    meta = {"pid": 1, "start_time": 0.0, "end_time": 60.0, "duration_ns": 60 * 10 ** 9}
    if reference is not None:
        meta["machine"] = {"reference_ns": reference, "load": 1.0}
    return Snapshot([loaded(st("request", calls, int(wall_ms * MS), cpu_ns=int(calls * cpu_ms * MS)), waiting),
                     loaded(st("request/model", calls, int(wall_ms * MS * 0.8), cpu_ns=int(calls * cpu_ms * MS * 0.8)),
                            waiting)], meta)


def test_wall_is_not_evidence_where_the_machine_differed():
    d = D.diff(run(10, 9, 0.02, 80.0), run(16, 9, 0.38, 81.0))       # +60 % wall, all of it waiting for a CPU
    assert d.machine.differed and d.machine.line == (
        "the machines differed: after spent 38 % of its running time waiting for a CPU, before 2 %; its reference "
        "loop took 81.0 ns per iteration, before 80.0 (+1 %); load 1.0, before 1.0: wall-time changes are not "
        "evidence")
    r = d.row("request/model")
    assert r.tests["wall"].significant and r.not_evidence == {
        "wall": "the machines differed; on a CPU or waiting for one 94 % of its time: CPU time judges it"}
    assert r.judgement == "within noise" and r.decision[0] == "cpu" and not d.regressions(0.05)
    assert d.tests == 2                                                # only the CPU tests count
    text = DIFF.render(d)
    assert "typical call +60.0%" in text and "not evidence (the machines differed; on a CPU or waiting" in text
    slower = D.diff(run(10, 9, 0.02, 80.0), run(22, 18, 0.38, 81.0))   # CPU per call twice: the code's
    assert slower.row("request/model").judgement == "slower"
    assert [(r.path, k) for r, k, _ in slower.regressions(0.05)] == [(("request",), "cpu"), (("request", "model"), "cpu")]


def test_alike_machines_let_wall_judge_and_a_stage_own_wait_does_not():
    d = D.diff(run(10, 2, 0.02, 80.0), run(14, 2, 0.03, 82.0))
    assert not d.machine.differed and d.machine.line.startswith("the machines were alike: after spent 3 % of its")
    assert d.row("request").judgement == "slower" and d.row("request").decision[0] == "wall"
    b, a = run(10, 2, 0.02, 80.0), run(14, 2, 0.03, 82.0)
    a = Snapshot([a["request"], loaded(a["request/model"], 0.31)], a.meta)   # only model waited longer
    r = D.diff(b, a).row("request/model")
    assert r.not_evidence == {"wall": "it waited for a CPU 2 % → 31 % of its running time; waiting for a CPU "
                                      "+3.31 ms and the machine's speed +40 µs of its +3.2 ms per call"}


def with_gil(s, share):
    """Stage `s` with `share` of its running time waiting for the GIL (its samples: all of its blocked ones)."""
    gil = int(share * s.covered_run)
    return replace(s, gil_total=gil, gil_self=gil, gil_samples={"gil": 50.0, "blocked": 50.0, "gil_total": 50.0,
                                                              "blocked_total": 50.0})


def test_a_change_of_gil_wait_is_waiting_not_code():
    """The wall time grew by what the stage waited for the GIL, its CPU time did not: the wall change is explained
    as waiting (not evidence); a wall change the GIL wait does not explain stays evidence."""
    b, a = run(10, 2, 0.02, 80.0), run(14, 2, 0.02, 80.0)
    b = Snapshot([b["request"], with_gil(b["request/model"], 0.5)], b.meta)
    a = Snapshot([a["request"], with_gil(a["request/model"], 0.636)], a.meta)
    r = D.diff(b, a).row("request/model")
    assert b["request/model"].split_part("gil") == pytest.approx(0.5 * 8 * MS * 400, rel=1e-6)
    assert r.not_evidence["wall"].startswith("it waited for the GIL 50 % → 64 % of its running time; waiting for a "
                                             "CPU +64 µs, for the GIL +3.12 ms and the machine's speed +0 µs of its "
                                             "+3.2 ms per call"), r.not_evidence
    a2 = Snapshot([a["request"], with_gil(run(14, 2, 0.02, 80.0)["request/model"], 0.52)], a.meta)
    assert "wall" not in D.diff(b, a2).row("request/model").not_evidence   # +3.2 ms, of it GIL wait +1 ms or so


def test_a_slower_machine_raises_the_floor_of_time_on_plain_runs():
    d = D.diff(run(10, 9, 0.02, 80.0), run(14, 12.6, 0.02, 120.0))    # reference loop +50 %, CPU per call +40 %
    assert d.machine.differed and d.machine.speed_change == pytest.approx(0.4)   # the part the stages share
    assert "(+50 %), which the stages' own CPU time per call shares in part (their median moved +40 %)" in \
        d.machine.line
    cpu = d.row("request/model").tests["cpu"]
    assert cpu.min_change == pytest.approx(0.4) and not cpu.significant and "reaches within ±40%" in cpu.reason


def test_undescribed_machines():
    c = M.compare(snap(st("a", 3, MS)), snap(st("a", 3, MS)))
    assert not c.differed and "do not describe their machines" in c.line and c.speed_change is None


def test_reference_and_load_survive_merge_and_save(tmp_path):
    a = run(10, 9, 0.02, 80.0)
    b = Snapshot(a.stages, dict(a.meta, start_time=100.0, end_time=160.0, machine={"reference_ns": 90.0, "load": 3.0}))
    m = a.merge(b)
    m.save(tmp_path / "m.json")
    again = Snapshot.load(tmp_path / "m.json")
    assert [s["machine"]["reference_ns"] for s in again.meta["merged_from"]] == [80.0, 90.0]
    assert M.machine(again).reference_ns == 85.0 and M.machine(again).load == 2.0


# ------------------------------------------------------------------------ counted work and items
def test_items_and_page_faults_per_call_are_judged_but_items_are_no_regression():
    def side(tokens, faults):
        s = replace(st("tokenize", 1000, 50_000, cpu_ns=1000 * 50_000,
                       counters={"page-faults": {"total": faults, "counted_calls": 1000}}),
                    items={"tokens": {"total": tokens, "calls": 1000}})
        return snap(s)
    d = D.diff(side(8000, 4000), side(10_000, 4000))
    r = d.row("tokenize")
    assert r.tests["item:tokens"].significant and r.tests["item:tokens"].estimate == pytest.approx(0.25, rel=1e-3)
    assert r.judgement == "slower" and not d.regressions(0.05)         # more tokens a call: other work, no regression
    assert "page-faults" in r.tests and not r.tests["page-faults"].significant
    d = D.diff(side(8000, 4000), side(8000, 8000))
    assert [k for _, k, _ in d.regressions(0.5)] == ["page-faults"]


# ------------------------------------------------------------------------ the CI gate
def write(tmp_path, before, after):
    a, b = tmp_path / "before.json", tmp_path / "after.json"
    before.save(a)
    after.save(b)
    return str(a), str(b)


@pytest.mark.parametrize("cpu_ms,pct,rc", [(9, 5, 3), (18, 5, 1), (18, 150, 0), (18, 99.9, 1), (9, 0, 3),
                                           (9, 40, 0)])
def test_fail_on_regression(tmp_path, capsys, cpu_ms, pct, rc):
    a, b = write(tmp_path, run(10, 9, 0.02, 80.0), run(16, cpu_ms, 0.38, 81.0))   # wall +60 %: the machine's
    summary = tmp_path / "summary.json"
    assert cli.main(["diff", a, b, "--fail-on-regression", str(pct), "--summary", str(summary)]) == rc
    out, err = capsys.readouterr()
    assert out.startswith("request: 10.0 ms → 16.0 ms (+60.0%); ")
    j = json.loads(summary.read_text())
    assert j["gate"]["failed"] is (rc == 1) and j["machine"]["line"].startswith("the machines differed")
    assert j["gate"]["outcome"] == {0: "passed", 1: "failed", 3: "inconclusive"}[rc]
    # each side a 60 s run whose calls all took the same time: the machine's variance alone, two tests at 0.5 %
    cpu = next(r for r in j["rows"] if r["path"] == ["request"])["tests"]["cpu"]
    half = NormalDist().inv_cdf(1 - 0.0025) * math.sqrt(2 * (0.27 ** 2 * 0.4 / 60 + 0.07 ** 2))
    assert cpu["detectable"] == pytest.approx(math.exp(half) * 1.03 - 1, rel=1e-6)
    if rc == 3:   # what could not have shown PCT, how far it could see, and how many runs would show PCT
        assert f"inconclusive (exit 3): could not have shown a regression of {pct:g}%" in err
        assert f"request CPU per call flags a rise from +{100 * cpu['detectable']:.1f}%" in err
        assert [g["path"] for g in j["gate"]["blind"]] == [["request"], ["request", "model"]]
        assert "runs a side would (from the measured spread)" in err or "within the smallest change" in err
        for choice, code in (("pass", 0), ("fail", 1)):
            assert cli.main(["diff", a, b, "--fail-on-regression", str(pct), "--on-inconclusive", choice]) == code
    model = next(r for r in j["rows"] if r["path"] == ["request", "model"])
    assert model["tests"]["wall"]["significant"] is False and model["tests"]["wall"]["beyond_noise"] is True
    assert model["tests"]["wall"]["not_evidence"].startswith("the machines differed; on a CPU or waiting")
    assert model["tests"]["cpu"]["significant"] is (cpu_ms == 18)
    if rc == 1:
        assert len(err.strip().splitlines()) == 1 and "2 regressions beyond noise and over" in err
        assert [g["figure"] for g in j["gate"]["regressions"]] == ["cpu", "cpu"]
    elif 0 < pct < 60:   # the wall time over PCT is named, and why it does not fail the gate
        assert "request/model typical call +60.0%" in err and "not evidence (the machines differed;" in err


def test_diff_cli_formats_basis_and_warning(tmp_path, capsys):
    a, b = write(tmp_path, *pair(after_ms=30))
    assert cli.main(["diff", a, b]) == 0                                # slower, but no gate asked for
    assert cli.main(["diff", a, b, "--format", "json", "--basis", "turns"]) == 0
    out, err = capsys.readouterr()
    j = json.loads(out[out.index("{", out.index("\n{") if "\n{" in out else 0):])
    assert j["basis"] == "runs" and j["requested_basis"] == "turns" and j["warnings"]
    assert err.strip() == ("instrument: diff: basis turns cannot hold: the windows do not alternate in time (0 of 1 "
                           "make turns; 8+ pairs taking in 80 % of each side are needed); judged on runs instead")
    assert cli.main(["diff", a, b, "--summary", "-"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("\n{") + 1:])["headline"].startswith("request: 25.0 ms → 30.0 ms")
    assert cli.main(["diff", a, b, "--alpha", "0.9"]) == 2
    assert "argument --alpha: must be a number from 1e-09 to 0.5, got '0.9'" in capsys.readouterr().err


def test_diff_table_fits_a_width_and_names_what_it_dropped():
    d = D.diff(*pair(after_calls=50))
    full = DIFF.render(d).splitlines()
    assert max(map(len, full)) > 80
    for width in (80, 100):
        lines = DIFF.render(d, width=width).splitlines()
        assert max(map(len, lines)) <= width
        head = next(l for l in lines if l.startswith("stage "))
        assert "mean" in head and "change" in head
    footer = " ".join(DIFF.render(d, width=80).splitlines()[-2:])
    assert "not shown at 80 columns: total ms before/after/Δ" in footer
    assert "not shown at" not in DIFF.render(d, width=400)


def test_diff_at_80_columns_through_the_command(tmp_path):
    before, after = pair()
    mig = lambda x: {"instructions": {"total": 10_000}, "cpu-migrations": {"total": x}}   # noqa: E731
    before = snap(*[s if s.path != ("request", "model") else st("request/model", 100, 20 * MS, counters=mig(4.043))
                    for s in before])
    after = snap(*[s if s.path != ("request", "model") else st("request/model", 100, 14 * MS, counters=mig(3))
                   for s in after])
    before.save(tmp_path / "a.json")
    after.save(tmp_path / "b.json")
    from snapfactory import cli as run_cli
    import os
    os.environ["COLUMNS"], old = "80", os.environ.get("COLUMNS")
    try:
        r = run_cli("diff", tmp_path / "a.json", tmp_path / "b.json")
    finally:
        os.environ.pop("COLUMNS") if old is None else os.environ.__setitem__("COLUMNS", old)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(l) <= 80 for l in lines), [l for l in lines if len(l) > 80]
    head = next(i for i, l in enumerate(lines) if l.startswith("stage "))
    basis = next(i for i, l in enumerate(lines) if l.startswith("basis: "))
    assert head - basis <= 3 and lines[head - 1] == ""      # the basis: at most 2 lines before the table
    assert "p50 Δ%" in lines[head] and "mean" in lines[head] and "CPU/call Δ%" in lines[head]
    assert "    cpu-migrations: 4 → 3 (−25.8%; not judged: load moves it)" in lines   # counts are whole


# ------------------------------------------------------------------------ the machine probe
def probed(s, ns, se=0.002, kept=200):
    """Snapshot `s` with the machine probe's figures in its meta (ns per iteration, the standard error of its log)."""
    machine = dict(s.meta.get("machine") or {}, probe={"ns": ns, "se_log": se, "median": ns, "timings": kept,
                                                       "kept": kept, "iterations": 400})
    return Snapshot(s.stages, dict(s.meta, machine=machine))


def test_the_machine_probe_is_the_machines_speed_through_the_run():
    before = probed(run(10, 9, 0.02, 80.0), 40.0)
    # the import-time loop says +50 % (a moment), the probe through the run +8 %: the probe is the machine's speed
    d = D.diff(before, probed(run(10.8, 9.72, 0.02, 120.0), 43.2))
    assert d.machine.speed_change == pytest.approx(0.08) and not d.machine.differed
    assert "its probe loop took 43.2 ns per iteration through the run, before 40.0 (+8 %)" in d.machine.line
    assert "reference loop" not in d.machine.line
    cpu = d.row("request/model").tests["cpu"]
    assert cpu.min_change == pytest.approx(0.08) and not cpu.significant   # within the machine's change: not claimed
    d = D.diff(before, probed(run(10, 9, 0.02, 80.0), 48.0))               # +20 %: the machines differed
    assert d.machine.differed and "(+20 %)" in d.machine.line
    # a side without the probe: the loops timed at import
    d = D.diff(before, run(10, 9, 0.02, 88.0))
    assert "its reference loop took 88.0 ns per iteration, before 80.0 (+10 %)" in d.machine.line


def test_the_probe_survives_merge_and_weighs_its_sources():
    a = probed(run(10, 9, 0.02, 80.0), 40.0, kept=100)
    b = probed(Snapshot(a.stages, dict(a.meta, start_time=0.5)), 44.0, kept=300)
    assert M.machine(a.merge(b)).probe_ns == pytest.approx((40 * 100 + 44 * 300) / 400)
    assert M.machine(run(10, 9, 0.02, 80.0)).probe_ns is None   # a snapshot without the probe


def three_runs(work_ms, probe_ns, start, speed=1.0):
    """Three plain runs merged (each a process of its own) on a machine `speed` times slower: request holds tokenize
    (2 ms) and work (`work_ms`), each run's CPU time per call 1 % apart, with the probe's figures."""
    runs = []
    for k, wobble in enumerate((1.0, 1.01, 0.99)):
        ms = {"request/tokenize": 2 * wobble * speed, "request/work": work_ms * wobble * speed}
        stages = [st("request", 1000, int(sum(ms.values()) * MS), cpu_ns=int(1000 * sum(ms.values()) * MS))]
        stages += [st(p, 1000, int(v * MS), cpu_ns=int(1000 * v * MS)) for p, v in ms.items()]
        runs.append(probed(snap(*stages, pid=100 + k, start=start + 100 * k), probe_ns))
    return runs[0].merge(*runs[1:])


def test_the_probe_never_vetoes_a_change_the_stages_do_not_share():
    before = three_runs(10, 89.0, 0.0)
    # work 30 % more; the probe 71 % slower beside a hog, which the stages' CPU time per call does not share
    d = D.diff(before, three_runs(13, 152.6, 1000.0))
    assert d.basis == "runs" and d.row("request/work").tests["cpu"].n == (3, 3)
    work = d.row("request/work").tests["cpu"]
    assert work.significant and work.estimate == pytest.approx(0.3) and work.min_change == pytest.approx(0.03)
    assert ("request", "work") in {r.path for r, k, _ in d.regressions(0.1)}
    assert d.machine.speed_change is None and "(+71 %), which the stages' own CPU time per call does not share " \
        "(their median moved +14 %): it is not taken as the machine's change of speed" in d.machine.line
    assert not d.row("request/tokenize").significant
    # the same code on a machine 30 % slower, the probe with it: the machine's change, not claimed as the code's
    d = D.diff(before, three_runs(10, 89.0 * 1.3, 1000.0, speed=1.3))
    assert d.machine.speed_change == pytest.approx(0.3) and not d.regressions(0.1)
    assert d.row("request/work").tests["cpu"].min_change == pytest.approx(0.3)
    # part shared: the probe +50 %, the stages +30 % (the machine's part and no more taken)
    d = D.diff(before, three_runs(10, 89.0 * 1.5, 1000.0, speed=1.3))
    assert d.machine.speed_change == pytest.approx(0.3) and "(+50 %), which the stages' own CPU time per call shares in part (their " \
        "median moved +30 %): that part is taken as the machine's change of speed" in d.machine.line


# ------------------------------------------------------------------------ a reference stage
def test_a_reference_stage_takes_the_machine_out():
    def side(speed, model_ms):          # the machine's speed multiplies both stages of the same calls
        request = st("request", 1000, int((2 + model_ms) * speed * MS), cpu_ns=int(1000 * (2 + model_ms) * speed * MS))
        return snap(replace(request, cpu_self=0),                       # all of request's time is its children's
                    st("request/tokenize", 1000, int(2 * speed * MS), cpu_ns=int(1000 * 2 * speed * MS)),
                    st("request/model", 1000, int(model_ms * speed * MS), cpu_ns=int(1000 * model_ms * speed * MS)))
    before, after = side(1.0, 10), side(1.5, 13)          # the machine 50 % slower, model 30 % more work
    plain = D.diff(before, after)
    assert plain.row("request/tokenize").judgement == "slower"          # the machine, taken for code
    assert plain.machine.common is None                                 # two stages that hold none: no common change
    d = D.diff(before, after, reference="request/tokenize")
    assert d.reference == ("request", "tokenize") and d.machine.speed_change == pytest.approx(0.5)
    assert "the reference stage request/tokenize took +50 % CPU time per call, taken as the machine's change of " \
           "speed" in d.machine.line
    model = d.row("request/model")
    assert model.judgement == "slower" and model.tests["cpu"].estimate == pytest.approx(0.3, abs=0.002)
    ref = d.row("request/tokenize")
    assert ref.judgement == "untested" and ref.not_evidence["cpu"] == "the reference: its change is taken as the machine's"
    assert json.loads(DIFF.render(d, "json"))["reference"] == ["request", "tokenize"]
    with pytest.raises(ValueError, match="reference stage 'nope' needs calls and CPU time in both snapshots"):
        D.diff(before, after, reference="nope")


# ------------------------------------------------------------------------ one run a side: the stages' common change
def machine_and_code(speed, probe_ns, model=1.0, others=1.0, rare=False):
    """One plain run: the probe loop and four stages whose own CPU time per call is the machine's speed times their
    code's work (request's own 1 ms, tokenize 2 ms, model 10 ms times `model`, alloc 3 ms; `others` multiplies all
    but model's), and a rare stage of 4 calls whose CPU per call spreads wide."""
    own = {"request": 1 * others, "request/tokenize": 2 * others, "request/model": 10 * model,
           "request/alloc": 3 * others}
    ms = {k: v * speed for k, v in own.items()}
    total = sum(ms.values())
    stages = [replace(st("request", 1000, int(total * MS), cpu_ns=int(1000 * total * MS)),
                      cpu_self=int(1000 * ms["request"] * MS))]
    stages += [st(k, 1000, int(v * MS), cpu_ns=int(1000 * v * MS)) for k, v in ms.items() if k != "request"]
    if rare:
        stages.append(st("request/rare", 4, 0, values=[MS, 3 * MS, MS, 3 * MS], cpu_ns=8 * MS))
    return probed(snap(*stages), probe_ns)


def test_one_run_a_side_judges_cpu_against_the_change_the_stages_share():
    before = machine_and_code(1.0, 40.0, rare=True)
    after = machine_and_code(1.4, 56.0, model=1.3, rare=True)   # the machine 40 % slower; model 30 % more work
    d = D.diff(before, after)
    c = d.machine.common
    assert c.members == ("request/tokenize", "request/model", "request/alloc")   # no parent, not the rare stage
    assert d.machine.speed_change == pytest.approx(0.4) and d.machine.differed
    assert "the stages' CPU time per call moved +40 % in their median (3 stages that hold no other), taken as the " \
           "machine's change of speed" in d.machine.line
    assert "CPU time per call is judged against the change the stages share" in d.basis_reason
    model = d.row("request/model")
    assert model.judgement == "slower" and model.tests["cpu"].estimate == pytest.approx(0.3)
    assert model.tests["cpu"].min_change == pytest.approx(0.03)          # no floor of the machine's change
    for path in ("request/tokenize", "request/alloc"):
        assert d.row(path).tests["cpu"].estimate == pytest.approx(0.0, abs=1e-9)
        assert d.row(path).judgement == "within noise"
    # request holds model: 16 → 26.6 ms, +18.75 % beyond the machine's +40 %
    assert d.row("request").tests["cpu"].estimate == pytest.approx(26.6 / 16 / 1.4 - 1)
    assert d.row("request").judgement == "slower"
    j = json.loads(DIFF.render(d, "json"))
    assert j["machine"]["common"]["change"] == pytest.approx(0.4)
    assert j["machine"]["common"]["members"]["request/model"] == pytest.approx(1.4 * 1.3 - 1)
    # a named reference stage takes the machine out in its place
    assert D.diff(before, after, reference="request/tokenize").machine.common is None


def test_a_change_every_stage_shares_is_taken_as_the_machines_and_the_line_says_so():
    before = machine_and_code(1.0, 40.0)
    d = D.diff(before, machine_and_code(1.0, 40.0, others=1.3, model=1.3))   # all 30 % more work; the probe alike
    assert d.machine.speed_change == pytest.approx(0.3) and not any(r.significant for r in d.rows)
    assert "its probe loop took 40.0 ns per iteration through the run, before 40.0 (+0 %); the stages' CPU time " \
           "per call moved +30 % in their median (3 stages that hold no other)" in d.machine.line
    # the same code on a machine 30 % slower: the same verdicts
    d = D.diff(before, machine_and_code(1.3, 52.0))
    assert d.machine.common.change == pytest.approx(math.log(1.3)) and not any(r.significant for r in d.rows)


# ------------------------------------------------------------------------ several runs a side: each run's common level
def runs_of_code(speeds, model=1.0, stray=None, start=0.0):
    """Plain runs merged (each a process of its own), the machine `speeds[k]` times slower in run k: request's own
    1 ms, tokenize 2 ms, model 10 ms times `model`, alloc 3 ms, each run's CPU per call 1 % apart as well;
    `stray`: (run, factor) by which model alone took longer in that run (a burst that hit it)."""
    runs = []
    for k, speed in enumerate(speeds):
        wobble = (1.0, 1.01, 0.99, 1.005, 0.995)[k % 5]
        own = {"request/tokenize": 2.0, "request/model": 10.0 * model, "request/alloc": 3.0}
        ms = {p: v * speed * wobble for p, v in own.items()}
        if stray is not None and stray[0] == k:
            ms["request/model"] *= stray[1]
        total = sum(ms.values()) + speed
        stages = [replace(st("request", 1000, int(total * MS), cpu_ns=int(1000 * total * MS)),
                          cpu_self=int(1000 * speed * MS))]
        stages += [st(p, 1000, int(v * MS), cpu_ns=int(1000 * v * MS)) for p, v in ms.items()]
        runs.append(snap(*stages, pid=100 + k, start=start + 100 * k))
    return runs[0].merge(*runs[1:])


def test_several_runs_a_side_judge_cpu_against_each_runs_common_level():
    before = runs_of_code((1.0, 1.05, 0.97))
    after = runs_of_code((1.25, 1.1, 1.4), model=1.3, start=1000.0)   # the machine strays run to run; model +30 %
    d = D.diff(before, after)
    assert d.basis == "runs" and "CPU time per call is judged in each run against the change the stages share in " \
        "that run" in d.basis_reason and "the spread between runs of those 3 stages pooled over them" in d.basis_reason
    c = d.machine.common
    assert c.members == ("request/tokenize", "request/model", "request/alloc")
    # each run's level is the machine's speed in it (and the wobble all stages share), over before's mean
    base = sum(math.log(s * w) for s, w in zip((1.0, 1.05, 0.97), (1.0, 1.01, 0.99))) / 3
    want = [math.log(s * w) - base for s, w in zip((1.0, 1.05, 0.97, 1.25, 1.1, 1.4), (1.0, 1.01, 0.99) * 2)]
    assert [lv for _, _, lv in c.runs] == pytest.approx(want, abs=1e-6)
    assert c.change == pytest.approx(sum(want[3:]) / 3 - sum(want[:3]) / 3, abs=1e-9)
    model = d.row("request/model").tests["cpu"]
    assert model.significant and model.estimate == pytest.approx(0.3, abs=1e-6) and model.n == (3, 3)
    assert ("request", "model") in {r.path for r, _, _ in d.regressions(0.1)}
    for path in ("request/tokenize", "request/alloc"):
        assert not d.row(path).significant and d.row(path).tests["cpu"].estimate == pytest.approx(0.0, abs=1e-6)
    # without the levels the machine's straying is the spread between runs: the same change is not seen
    raw = [[(10 * m * s * w, 0.0) for s, w in zip(speeds, (1.0, 1.01, 0.99))]
           for m, speeds in ((1.0, (1.0, 1.05, 0.97)), (1.3, (1.25, 1.1, 1.4)))]
    assert not S.runs_test(raw[0], raw[1], 1 - model.level, 0.03).significant
    j = json.loads(DIFF.render(d, "json"))
    assert [r["level"] for r in j["machine"]["common"]["runs"]] == pytest.approx([math.expm1(x) for x in want],
                                                                                 abs=1e-6)


def test_a_burst_in_one_run_of_one_stage_is_weighed_with_its_siblings_spread():
    before = runs_of_code((1.0, 1.05, 0.97))
    after = runs_of_code((1.25, 1.1, 1.4), model=1.3, stray=(1, 1.15), start=1000.0)   # model +15 % more in one run
    model = D.diff(before, after).row("request/model").tests["cpu"]
    assert model.significant and model.estimate == pytest.approx(1.3 * 1.15 ** (1 / 3) - 1, abs=1e-6)
    # its own spread alone, three runs a side (4 degrees of freedom), would not have told
    logs = [[math.log(x) for x in side] for side in ([1.0, 1.0, 1.0], [1.3, 1.3 * 1.15, 1.3])]
    own = S.runs_test([(math.exp(x), 0.0) for x in logs[0]], [(math.exp(x), 0.0) for x in logs[1]],
                           1 - model.level, 0.03)
    assert not own.significant and own.detectable > model.detectable
    # the same burst on identical code is no change: it widens the spread it is weighed with
    same = D.diff(before, runs_of_code((1.25, 1.1, 1.4), stray=(1, 1.3), start=1000.0))
    assert not any(r.significant for r in same.rows)


def test_identical_code_on_a_straying_machine_is_no_change_over_several_runs():
    d = D.diff(runs_of_code((1.0, 1.2, 0.9)), runs_of_code((1.3, 0.95, 1.15), start=1000.0))
    assert d.machine.common is not None and not any(r.significant for r in d.rows)
    # a named reference stage takes the machine out in the levels' place
    assert D.diff(runs_of_code((1.0, 1.2, 0.9)), runs_of_code((1.3, 0.95, 1.15), start=1000.0),
                  reference="request/tokenize").machine.common is None
