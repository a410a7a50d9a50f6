"""Verdicts on stages whose truth is known, run for real."""
import threading
import time

import numpy as np
import pytest

import instrument
from instrument import counters, verdict
from instrument.snapshot import Snapshot, StageStats

HAS_PMU = counters.probe(["cycles", "instructions", "cache-misses", "cache-references"])["events"]["cycles"]["available"]


def spin(seconds):
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


def need_a_free_cpu():
    """A spinning stage is compute-bound only if the thread gets the CPU; on an
    overloaded machine it waits in the run queue, which CPU/wall rightly shows."""
    w0, c0 = time.perf_counter(), time.thread_time()
    spin(0.03)
    share = (time.thread_time() - c0) / (time.perf_counter() - w0)
    if share < 0.9:
        pytest.skip(f"machine overloaded: a spinning thread got {share:.0%} of a CPU")


def test_sleep_is_waiting_spin_is_compute_bound(backend):
    with instrument.stage("sleepy"):
        time.sleep(0.05)
    for _ in range(5):
        instrument.reset()
        with instrument.stage("busy"):
            w0, c0 = time.perf_counter(), time.thread_time()
            spin(0.05)
            share = (time.thread_time() - c0) / (time.perf_counter() - w0)
        if share >= 0.9:
            break
    else:
        pytest.skip(f"machine overloaded: the spinning stage got {share:.0%} of a CPU")
    with instrument.stage("sleepy"):
        time.sleep(0.05)
    snap = instrument.snapshot()
    assert snap["sleepy"].verdict["verdict"] == "waiting"
    assert snap["sleepy"].verdict["evidence"]["cpu_per_wall"] < 0.2
    b = snap["busy"].verdict
    assert b["verdict"] == "compute-bound"
    if not HAS_PMU:
        assert "no hardware counters" in b["reason"] and "cycles" in b["limited_by"]


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
        for v in (s, r):
            assert v["limited_by"] == list(verdict.HARDWARE)
            assert "memory" not in v["verdict"]        # no counters: no memory claim
            assert "no hardware counters" in v["reason"] or v["verdict"] in ("mixed", "waiting")


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


def test_thresholds_come_from_configuration(backend):
    with instrument.stage("half"):
        spin(0.02)
        time.sleep(0.03)
    assert instrument.snapshot()["half"].verdict["verdict"] in ("waiting", "mixed")
    instrument.configure(verdict_wait_cpu=0.01, verdict_compute_cpu=0.02)
    assert instrument.snapshot()["half"].verdict["verdict"] == "compute-bound"
    assert instrument.snapshot().meta["verdict_thresholds"]["compute_cpu"] == 0.02


def test_advice_names_the_right_next_step(backend):
    need_a_free_cpu()
    with instrument.stage("request"):
        with instrument.stage("tokenize"):
            spin(0.06)
        with instrument.stage("io"):
            time.sleep(0.03)
    snap = instrument.snapshot()
    adv = verdict.advise(snap)
    assert adv[0]["path"] == ["request", "tokenize"] and adv[0]["verdict"] == "compute-bound"
    assert "instrument.profile()" in adv[0]["next"]
    io = next(a for a in adv if a["path"] == ["request", "io"])
    assert io["verdict"] == "waiting" and "instrument nsys --capture io" in io["next"]
    assert 0.5 < adv[0]["saving_upper_bound"] < 1
    text = verdict.render_advice(snap)
    assert "request/tokenize: compute-bound" in text and "at most" in text


def test_diff_shows_each_stage_verdict_before_and_after():
    from instrument.diff import diff, render
    busy = StageStats(("req",), 10, 0, 50_000_000, 50_000_000, 1, 9, 49_000_000, 49_000_000, 10, {})
    idle = StageStats(("req",), 10, 0, 30_000_000, 30_000_000, 1, 9, 1_000_000, 1_000_000, 10, {})
    d = diff(Snapshot([busy]), Snapshot([idle]))
    assert d.rows[0].verdict == ("compute-bound", "waiting")
    assert "verdict: compute-bound → waiting" in render(d)
