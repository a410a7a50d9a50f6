"""The diff on real recordings: plain runs made by `instrument run` in separate processes, with a CPU hog
started by the test through one of them, and variants taking turns in one process.  What the diff says is
checked against what each run was made to do, and its machine line against the snapshots' own figures."""
import inspect
import json
import math
import os
import re
import statistics
import subprocess
import sys

import pytest

import instrument
from instrument.exporters.format import basis_parts
from instrument.snapshot import Snapshot
from conftest import HOG
from snapfactory import cli, env


def spin(n):
    """n iterations of pure-Python work."""
    x = 0
    for i in range(n):
        x += i * i
    return x


SERVICE = inspect.getsource(spin) + r"""
import sys, time
import instrument
tok, model, post = instrument.stage("tokenize"), instrument.stage("model"), instrument.stage("postprocess")
iterations, end = int(sys.argv[1]), time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    with instrument.stage("request"):
        with tok:
            spin(300)
            instrument.add("tokens", 8)
        with model:
            spin(iterations)
        with post:
            spin(200)
"""


def hogs():
    """A busy loop pinned to each core this process may use (the way a shared CI machine is loaded)."""
    return [subprocess.Popen([sys.executable, "-c", HOG, str(c)]) for c in sorted(os.sched_getaffinity(0))]


def plain_run(tmp_path, name, iterations, seconds=2.5, hog=False):
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    out = tmp_path / f"{name}.json"
    started = hogs() if hog else []
    try:
        # every call read: the CPU time per call is exact, so only the machine moves it
        r = subprocess.run([sys.executable, "-m", "instrument", "run", "-o", str(out), "--no-report", "--",
                            sys.executable, str(script), str(iterations), str(seconds)], capture_output=True, text=True,
                           timeout=120, env=dict(env(), INSTRUMENT_OVERHEAD_BUDGET="none"))
    finally:
        for h in started:
            h.kill()
            h.wait()
    assert r.returncode == 0, r.stderr
    return out


def waiting(path):
    """Share of the top-level stages' running time spent waiting for a CPU, from the snapshot file itself."""
    stages = [s for s in json.loads(path.read_text())["stages"] if len(s["path"]) == 1]
    rq = sum(s["wall_split_ns"]["runqueue"]["total"] for s in stages)
    return rq / sum(s["covered_running_ns"]["total"] for s in stages)


def cpu_per_call(path, stage):
    """A stage's CPU time per call, from the snapshot file itself."""
    c = next(s["cpu_ns"] for s in json.loads(path.read_text())["stages"] if s["path"] == stage.split("/"))
    return c["total"] / c["calls"]


def test_plain_runs_with_a_hog_fail_the_gate_on_the_stage_made_slower(tmp_path):
    before = plain_run(tmp_path, "before", 2000)
    after = plain_run(tmp_path, "after", 6000, hog=True)       # model does 3x the work, beside a hog per core
    summary = tmp_path / "summary.json"
    r = cli("diff", before, after, "--fail-on-regression", 20, "--summary", summary)
    assert r.returncode == 1, r.stdout + r.stderr
    j = json.loads(summary.read_text())
    assert j["basis"] == "runs" and "one run a side" in j["basis_reason"]
    said_all = " ".join(r.stdout.split())   # the text is wrapped to the terminal
    assert f"basis: {' '.join(basis_parts(j['basis_reason'])[0].split())}" in said_all
    assert f"basis in full: {' '.join(basis_parts(j['basis_reason'])[1].split())}" in said_all
    assert f"machine: {' '.join(j['machine']['line'].split())}" in said_all
    found = {(tuple(g["path"]), g["figure"]) for g in j["gate"]["regressions"]}
    assert (("request", "model"), "cpu") in found                  # 3x the loop: CPU per call beyond noise, > 20 %
    tokens = next(x for x in j["rows"] if x["path"] == ["request", "tokenize"])["tests"]["item:tokens"]
    assert tokens["basis"] == "none" and "the same in every window" in tokens["reason"]
    # the machine line's figures are the snapshots' own
    wb, wa = waiting(before), waiting(after)
    assert j["machine"]["before"]["waiting"] == pytest.approx(wb) and j["machine"]["after"]["waiting"] == pytest.approx(wa)
    said = re.search(r"after spent ([0-9.]+) % of its running time waiting for a CPU, before ([0-9.]+) %",
                     j["machine"]["line"])
    assert said, j["machine"]["line"]
    for shown, share in zip(said.groups(), (wa, wb)):   # whole percents, or one significant digit under 1 %
        assert float(shown) == pytest.approx(100 * share, abs=0.5 if share >= 0.01 else 0.5 * 100 * share)
    # the machine's speed: the probe's timings through each run
    probes = [json.loads(p.read_text())["meta"]["machine"]["probe"]["ns"] for p in (before, after)]
    assert f"probe loop took {probes[1]:.1f} ns per iteration through the run, before {probes[0]:.1f}" in \
        j["machine"]["line"]
    assert j["machine"]["differed"] == (abs(wa - wb) > 0.05 or abs(probes[1] / probes[0] - 1) > 0.1 or
                                        abs(j["machine"]["speed_change"]) > 0.1)
    # one run a side: CPU time judged against the change the stages share; its members are the stages that hold no
    # other, and each member's change is the files' own CPU time per call (tokenize's, the same code in both)
    common = j["machine"]["common"]
    if common is None:   # a stage's CPU per call strayed too far between windows (a loaded machine) to be a member
        assert "CPU time per call is judged against the change the stages share" not in j["basis_reason"]
        return
    assert "CPU time per call is judged against the change the stages share" in j["basis_reason"]
    assert set(common["members"]) <= {"request/tokenize", "request/model", "request/postprocess"}
    tok = cpu_per_call(after, "request/tokenize") / cpu_per_call(before, "request/tokenize") - 1
    assert common["members"]["request/tokenize"] == pytest.approx(tok)
    logs = [math.log1p(c) for c in common["members"].values()]
    assert len(logs) >= 3 and common["change"] == pytest.approx(math.expm1(statistics.median(logs)), abs=1e-9)


def test_three_runs_a_side_with_a_hog_through_one_judge_each_run_over_its_level(tmp_path):
    files = {side: [plain_run(tmp_path, f"{side}{k}", work, seconds=1.5, hog=side == "after") for k in range(3)]
             for side, work in (("before", 2000), ("after", 6000))}    # model 3x the work, a hog through after
    merged = {}
    for side, parts in files.items():
        merged[side] = tmp_path / f"{side}.json"
        assert cli("merge", *parts, "-o", merged[side]).returncode == 0
    summary = tmp_path / "summary.json"
    r = cli("diff", merged["before"], merged["after"], "--fail-on-regression", 20, "--summary", summary)
    assert r.returncode == 1, r.stdout + r.stderr
    j = json.loads(summary.read_text())
    assert j["basis"] == "runs" and "3 runs before, 3 after" in j["basis_reason"]
    assert (("request", "model"), "cpu") in {(tuple(g["path"]), g["figure"]) for g in j["gate"]["regressions"]}
    common = j["machine"]["common"]
    if common is None:   # a stage's CPU per call strayed too far within its runs (a loaded machine) to be a member
        assert "judged in each run against the change the stages share" not in j["basis_reason"]
        return
    assert "judged in each run against the change the stages share in that run" in j["basis_reason"]
    # each run's level from the files themselves: the median over the members of their log CPU per call less their
    # mean over the runs before
    members = list(common["members"])
    logs = {m: [[math.log(cpu_per_call(p, m)) for p in files[side]] for side in ("before", "after")]
            for m in members}
    base = {m: statistics.mean(logs[m][0]) for m in members}
    want = [statistics.median(logs[m][side][k] - base[m] for m in members) for side in (0, 1) for k in range(3)]
    assert [math.log1p(x["level"]) for x in common["runs"]] == pytest.approx(want, abs=1e-9)
    assert common["change"] == pytest.approx(math.expm1(statistics.mean(want[3:]) - statistics.mean(want[:3])),
                                             abs=1e-9)
    # model's estimate: its mean log CPU per call over the levels, after less before
    rel = [[logs["request/model"][side][k] - want[3 * side + k] for k in range(3)] for side in (0, 1)] \
        if "request/model" in members else None
    model = next(x for x in j["rows"] if x["path"] == ["request", "model"])["tests"]["cpu"]
    if rel is not None:
        assert model["estimate"] == pytest.approx(math.expm1(statistics.mean(rel[1]) - statistics.mean(rel[0])),
                                                  abs=1e-9)


def test_identical_plain_runs_with_a_hog_in_one_pass_the_gate(tmp_path):
    # two pairs: the diff may call identical code changed with a chance of 1 % (alpha), so both pairs failing
    # the gate would be a chance of 1 in 10,000
    failed = []
    for k in range(2):
        before = plain_run(tmp_path, f"before{k}", 2000, hog=k == 0)
        after = plain_run(tmp_path, f"after{k}", 2000, hog=k == 1)
        r = cli("diff", before, after, "--fail-on-regression", 5)
        assert r.returncode in (0, 1, 3), r.stderr                 # 3: inconclusive, a figure could not show 5 %
        failed.append((r.returncode, r.stderr))
    assert not all(rc == 1 for rc, _ in failed), failed


TWO_STAGES = inspect.getsource(spin) + r"""
import sys, time
import instrument
first, second = instrument.stage("first"), instrument.stage("second")
iterations, end = int(sys.argv[1]), time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    with first:
        spin(1000)
    with second:
        spin(iterations)
"""


def test_one_plain_run_a_side_never_passes_a_30_percent_slowdown_it_could_not_see(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(TWO_STAGES)
    runs = []
    for name, iterations in (("before", 1000), ("after", 1300)):    # second: 30 % more work
        out = tmp_path / f"{name}.json"
        r = subprocess.run([sys.executable, "-m", "instrument", "run", "-o", str(out), "--no-report", "--",
                            sys.executable, str(script), str(iterations), "1.5"], capture_output=True, text=True,
                           timeout=120, env=dict(env(), INSTRUMENT_OVERHEAD_BUDGET="none"))
        assert r.returncode == 0, r.stderr
        runs.append(out)
    summary = tmp_path / "summary.json"
    r = cli("diff", *runs, "--fail-on-regression", 10, "--summary", summary)
    j = json.loads(summary.read_text())
    assert r.returncode in (1, 3), r.stdout + r.stderr              # a regression, or inconclusive: never a pass
    assert j["gate"]["outcome"] == {1: "failed", 3: "inconclusive"}[r.returncode]
    for row in j["rows"]:   # each stage: the smallest rise its judged figures would flag, the largest of its tests'
        judged = [t["detectable"] for k, t in row["tests"].items() if t["evidence"] and t["basis"] != "none"
                  and (k in ("cpu", "wall", "instructions", "page-faults", "minor-faults", "major-faults")
                       or k.startswith("mem:"))]
        assert row["detectable"] == max(judged) and row["detectable"] > 0.03
        for t in row["tests"].values():   # each interval's half-width beyond the floor it had to clear
            if t["basis"] != "none" and t["interval"][1] is not None:
                lo, hi = (math.log1p(x) for x in t["interval"])
                assert t["detectable"] == pytest.approx(math.expm1((hi - lo) / 2 + math.log1p(t["min_change"])))
    if r.returncode == 3:   # it names what could not see 10 % and how much more would
        assert "inconclusive (exit 3): could not have shown a regression of 10%" in r.stderr
        # how many runs from the measured spread (or that more than the most it counts would be needed), or the
        # machine's change of speed (a floor) that no run count lowers
        floor = max(t["min_change"] for row in j["rows"] for t in row["tests"].values())
        assert re.search(r"about \d+ runs a side would \(from the measured spread\)|more than \d+ runs a side would "
                         r"be needed", r.stderr) or \
            (floor >= 0.1 and "+10.0% is within the machine's change of speed between these runs" in r.stderr), r.stderr
        assert {tuple(g["path"]) for g in j["gate"]["blind"]} & {("first",), ("second",)}
        assert cli("diff", *runs, "--fail-on-regression", 10, "--on-inconclusive", "pass").returncode == 0
        assert cli("diff", *runs, "--fail-on-regression", 10, "--on-inconclusive", "fail").returncode == 1
    else:
        assert ["second"] in [g["path"] for g in j["gate"]["regressions"]]


def chunked(iterations, turns=16, calls=40):
    """Before and after taking turns in one process, each chunk a snapshot, merged per side (as instrument demo)."""
    model = instrument.stage("model")
    parts = ([], [])
    for k in range(turns):
        for side in ((0, 1) if k % 2 == 0 else (1, 0)):
            instrument.reset()
            for _ in range(calls):
                with instrument.stage("request"):
                    with model:
                        spin(iterations[side])
            parts[side].append(instrument.snapshot())
    return parts[0][0].merge(*parts[0][1:]), parts[1][0].merge(*parts[1][1:])


def test_turns_in_one_process_are_paired_and_say_so(backend):
    instrument.configure(overhead_budget=None)                     # every call read: exact CPU time per chunk
    before, after = chunked((1000, 2000))
    d = instrument.diff(before, after)
    assert d.basis == "turns" and "16 pairs" in d.basis_reason
    model = d.row("model" if d.row("model") else "request/model")
    assert model.judgement == "slower" and model.significance.n == (16, 16)
    # where they differed, the line names the CPU contention: run-queue time, or preemptions where that is not read
    assert not d.machine.differed or "waiting for a CPU" in d.machine.line or "preempted" in d.machine.line
    runs = instrument.diff(before, after, basis="runs")            # each chunk a run: the spread between measured
    assert runs.basis == "runs" and runs.basis_reason.startswith("runs, as asked: 16 runs before, 16 after")
    assert runs.row("request/model").tests["cpu"].n == (16, 16)
    assert Snapshot.from_dict(json.loads(after.to_json()))["request/model"].windows[0]["items"] == {}


def test_a_reference_stage_of_the_same_calls_takes_a_hog_and_a_wandering_machine_out(tmp_path):
    before = plain_run(tmp_path, "before", 2000)
    after = plain_run(tmp_path, "after", 3200, hog=True)       # model does 1.6x the work, beside a hog per core
    r = cli("diff", before, after, "--reference", "request/tokenize", "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    rows = {tuple(x["path"]): x for x in d["rows"]}
    assert rows[("request", "model")]["judgement"] == "slower"
    cpu = rows[("request", "model")]["tests"]["cpu"]       # relative to tokenize: beyond noise, slower
    assert cpu["significant"] and cpu["interval"][0] > 0        # (how much of the 60 % is left moves with the load)
    assert rows[("request", "tokenize")]["judgement"] == "untested"
    assert "the reference stage request/tokenize took" in d["machine"]["line"]
