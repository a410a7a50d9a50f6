"""Verdicts on stages whose truth is known, run for real."""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import instrument
from instrument.analysis import advice, verdict
from instrument.exporters import ADVICE, DIFF
from instrument.live import perf
from instrument.snapshot import Snapshot, StageStats

HAS_PMU = perf.probe(["cycles", "instructions", "cache-misses", "cache-references"])["events"]["cycles"]["available"]


def spin(seconds):
    """Computes in user space for `seconds` of CPU time (the clock, a system call on some VMs, is read
    only every half millisecond or so, so the stage is not judged by its clock reads)."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        x = 0
        for i in range(20_000):
            x += i


def measured_spin(seconds):
    """Spin for `seconds` of CPU time; returns the share of a CPU the thread was given
    (on a loaded machine it waits in the run queue, which CPU/wall rightly shows)."""
    w0, c0 = time.perf_counter(), time.thread_time()
    spin(seconds)
    return (time.thread_time() - c0) / (time.perf_counter() - w0)


def verdicts_for(share, margin=0.03):
    """The verdicts the default thresholds allow for a stage given `share` of a CPU,
    both neighbours when the share is within `margin` of a threshold."""
    th = verdict.thresholds()
    out = set()
    for x in (share - margin, share, share + margin):
        out.add("waiting" if x < th["wait_cpu"] else "compute-bound" if x >= th["compute_cpu"] else "mixed")
    return out


def test_blocked_on_a_lock_is_waiting_with_context_switches(backend):
    instrument.configure(counters=["task-clock", "context-switches"])
    lock = threading.Lock()
    lock.acquire()
    t = threading.Timer(0.05, lock.release)
    t.start()
    with instrument.stage("locked"):
        lock.acquire()
    t.join()
    v = instrument.snapshot()["locked"].verdict
    assert v["verdict"] == "waiting"
    assert v["evidence"]["context_switches_per_call"] >= 1 and "context switches" in v["reason"]


def starved(v):
    """A cpu-starved verdict whose own evidence shows the run-queue share that makes it so."""
    return v["verdict"] == "cpu-starved" and \
        v["evidence"]["split"]["runqueue"] >= instrument.current_config().verdict_runqueue_share


@pytest.mark.native_only   # a loaded machine's calls judged by their run-queue time: the C core's
def test_random_stride_vs_streaming_is_honest_about_missing_counters(backend):
    a = np.arange(1 << 23, dtype=np.int64)           # 64 MiB: larger than the caches
    idx = np.random.default_rng(0).permutation(a.size)
    with instrument.stage("stream"):
        for _ in range(3):
            a.sum()
    with instrument.stage("random"):
        a[idx].sum()
    snap = instrument.snapshot()
    s, r = snap["stream"].verdict, snap["random"].verdict
    if HAS_PMU:
        assert snap["random"].counter("cache-misses") > snap["stream"].counter("cache-misses")
    else:
        for v in (s, r):   # and system time, where a stage's CPU in all is less than the kernel's ticks resolve
            assert v["limited_by"][:len(verdict.HARDWARE)] == list(verdict.HARDWARE)
            assert all(x.startswith("system time (its CPU time in all") for x in v["limited_by"][len(verdict.HARDWARE):])
            assert "memory" not in v["verdict"]        # no counters: no memory claim
            # (on a loaded machine, a stage that waited for a CPU long enough is cpu-starved: said with its share)
            assert "no hardware counters" in v["reason"] or v["verdict"] in ("mixed", "waiting", "kernel-bound") \
                or starved(v)
    # the gather allocates 64 MiB of fresh pages: its faults may make it kernel-bound, said with the numbers
    if r["verdict"] == "kernel-bound":
        assert r["evidence"]["sys_share"] >= 0.5 and r["evidence"]["page_faults_per_call"] > 100   # 16,384 4 KiB pages, or 544 with huge pages


def test_memory_bound_from_crafted_counters():
    th = verdict.thresholds()

    def st(**ctr):
        return StageStats(("s",), 10, 0, 10_000_000, 10_000_000, 1, 2, 9_900_000, 9_900_000, 10, {},
                          counters={k: {"total": v, "self": v} for k, v in ctr.items()})
    mem = verdict.judge(st(cycles=1e7, instructions=4e6, **{"cache-misses": 2e5, "cache-references": 5e5}), th)
    assert mem["verdict"] == "memory-bound" and mem["evidence"]["ipc"] == 0.4 and mem["limited_by"] == []
    cpu = verdict.judge(st(cycles=1e7, instructions=3e7, **{"cache-misses": 1e3, "cache-references": 1e6}), th)
    assert cpu["verdict"] == "compute-bound" and "IPC 3.00" in cpu["reason"]
    gpu = verdict.judge(StageStats(("g",), 1, 0, 10_000_000, 10_000_000, 1, 1, 1_000_000, 1_000_000, 1, {},
                                   gpu={"total_ns": 9_000_000}), th)
    assert gpu["verdict"] == "gpu-bound"


@pytest.mark.native_only   # cpu-starved needs run-queue time: the C core's
def test_thresholds_come_from_configuration(backend):
    with instrument.stage("half"):
        spin(0.02)
        time.sleep(0.03)
    v = instrument.snapshot()["half"].verdict
    assert v["verdict"] in ("waiting", "mixed") or starved(v), v   # a loaded machine: cpu-starved, with its share
    instrument.configure(verdict_wait_cpu=0.01, verdict_compute_cpu=0.02, verdict_runqueue_share=1.0)
    assert instrument.snapshot()["half"].verdict["verdict"] == "compute-bound"
    assert instrument.snapshot().meta["verdict_thresholds"]["compute_cpu"] == 0.02


@pytest.mark.native_only   # a loaded machine's calls judged by their run-queue time: the C core's
def test_advice_names_the_right_next_step(backend):
    with instrument.stage("request"):
        with instrument.stage("tokenize"):
            share = measured_spin(0.06)
        with instrument.stage("io"):
            time.sleep(0.03)
    snap = instrument.snapshot()
    adv = advice.advise(snap)
    top = adv[0]
    assert top["path"] == ["request", "tokenize"], top
    assert top["verdict"] in verdicts_for(share) or starved(top), (top, share)   # a loaded machine: cpu-starved
    assert top["next"] == advice.NEXT_STEP[top["verdict"]].format(name="tokenize")
    if top["verdict"] == "compute-bound":
        assert "instrument.profile()" in top["next"]
    io = next(a for a in adv if a["path"] == ["request", "io"])
    assert io["verdict"] == "waiting" and "instrument nsys --capture io" in io["next"]
    assert 0.5 < top["saving_upper_bound"] < 1
    text = ADVICE.render(adv)
    assert f"request/tokenize: {top['verdict']}" in text and "at most" in text


def test_expected_verdicts_follow_the_thresholds():
    assert verdicts_for(0.97) == {"compute-bound"} and verdicts_for(0.2) == {"waiting"}
    assert verdicts_for(0.7) == {"mixed"} and verdicts_for(0.86) == {"mixed", "compute-bound"}


def test_diff_shows_each_stage_verdict_before_and_after():
    from instrument.analysis.diff import diff
    busy = StageStats(("req",), 10, 0, 50_000_000, 50_000_000, 1, 9, 49_000_000, 49_000_000, 10, {})
    idle = StageStats(("req",), 10, 0, 30_000_000, 30_000_000, 1, 9, 1_000_000, 1_000_000, 10, {})
    d = diff(Snapshot([busy]), Snapshot([idle]))
    assert d.rows[0].verdict == ("compute-bound", "waiting")
    assert "verdict: compute-bound → waiting" in DIFF.render(d)


def test_saved_snapshot_is_judged_by_the_thresholds_it_was_recorded_with(tmp_path):
    # CPU/wall 0.3: waiting by the defaults, compute-bound by the thresholds in force when it was recorded
    half = StageStats(("half",), 10, 0, 10_000_000, 10_000_000, 1, 2, 3_000_000, 3_000_000, 10, {})
    path = tmp_path / "a.json"
    Snapshot([half], {"verdict_thresholds": {"wait_cpu": 0.2, "compute_cpu": 0.25}}).save(path)
    assert verdict.with_verdicts(Snapshot([half]))["half"].verdict["verdict"] == "waiting"
    instrument.configure(verdict_wait_cpu=0.9, verdict_compute_cpu=0.95)   # the reader's options do not count
    assert verdict.with_verdicts(Snapshot.load(path))["half"].verdict["verdict"] == "compute-bound"
    env = dict(os.environ, INSTRUMENT_VERDICT_WAIT_CPU="0.9", INSTRUMENT_VERDICT_COMPUTE_CPU="0.95")
    r = subprocess.run([sys.executable, "-m", "instrument", "report", str(path), "--format", "json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["verdict"]["verdict"] == "compute-bound"
    with pytest.raises(ValueError, match="unknown verdict threshold colour"):
        verdict.with_verdicts(Snapshot([half]), {"colour": 1})


def test_kernel_time_is_judged_kernel_bound_with_its_evidence():
    from dataclasses import replace
    from instrument.analysis.advice import advise
    from snapfactory import snap, st
    ms = 1_000_000
    faults = {"page-faults": {"total": 12_800.0 * 40, "self": 12_800.0 * 40, "counted_calls": 40, "read_calls": 40}}
    alloc = replace(st("alloc", 40, 10 * ms, cpu_ns=40 * 10 * ms, counters=faults),
                    cpu_sys_total=int(0.8 * 400 * ms), cpu_sys_self=int(0.8 * 400 * ms))
    spin = replace(st("spin", 40, 10 * ms, cpu_ns=40 * 10 * ms), cpu_sys_total=4 * ms, cpu_sys_self=4 * ms)
    s = verdict.with_verdicts(snap(alloc, spin))
    v = s["alloc"].verdict
    assert v["verdict"] == "kernel-bound" and v["evidence"]["sys_share"] == 0.8
    assert v["evidence"]["page_faults_per_call"] == 12_800 and v["evidence"]["sys_ms_per_call"] == 8.0
    assert "80% of its CPU time is in the kernel" in v["reason"] and "12800 page faults per call" in v["reason"]
    assert s["spin"].verdict["verdict"] == "compute-bound"         # 1 % system time: the user's own code
    tip = next(a for a in advise(s) if a["path"] == ["alloc"] or tuple(a["path"]) == ("alloc",))
    assert "preallocate" in tip["next"] and "profile" not in tip["next"] and "operator" not in tip["next"]
    # the threshold is an option, recorded with the snapshot
    assert verdict.with_verdicts(snap(alloc), {"kernel_share": 0.9})["alloc"].verdict["verdict"] == "compute-bound"


def test_gil_bound_from_the_measured_gil_wait_names_where_to_look():
    """A stage 60 % of whose own time was GIL wait is gil-bound, the share printed as in its evidence, and the reason
    names the stages most on a CPU (which held the GIL is not sampled); the same stage with its GIL wait below a
    third and its other waits larger is not."""
    from dataclasses import replace
    from instrument.analysis import verdict as V
    from instrument.snapshot import Snapshot
    from snapfactory import st
    ms = 1_000_000

    def stage(path, gil_share, cpu_share, calls=100):
        s = st(path, calls, 10 * ms, cpu_ns=int(calls * 10 * ms * cpu_share))
        run = s.wall_total
        return replace(s, covered_run=run, covered_run_self=run, gil_total=int(gil_share * run),
                       gil_self=int(gil_share * run),
                       runqueue={"total": 0.05 * run, "self": 0.05 * run, "var": 0.0, "var_self": 0.0, "reads": calls},
                       gil_samples={"gil": 60.0, "blocked": 61.0, "gil_total": 60.0, "blocked_total": 61.0})
    snap = V.with_verdicts(Snapshot([stage("py", 0.6, 0.3), stage("tokenize", 0.0, 0.9), stage("io", 0.2, 0.1)],
                                    {"pid": 1, "start_time": 0.0, "end_time": 3.0, "duration_ns": 3 * 10 ** 9}))
    v = snap["py"].verdict
    assert v["verdict"] == "gil-bound" and "waiting to take the GIL 60% of its own time" in v["reason"]
    assert v["evidence"]["split"]["gil"] == 0.6
    assert "which stage held it is not sampled: the stages most on a CPU were tokenize" in v["reason"]
    assert snap["io"].verdict["verdict"] != "gil-bound"     # blocked otherwise 65 %: more than its GIL wait
