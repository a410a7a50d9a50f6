"""The straggler view on snapshots with known numbers: each figure is computed here from the same numbers."""
import json
import statistics

import pytest

from instrument.analysis.ranks import rank_view
from instrument.exporters import RANKS
from instrument.exporters.format import ranks_summary
from instrument.snapshot import Snapshot, merge_all
from snapfactory import snap, st

MS = 1_000_000
STEPS = 10


def rank_snap(rank, *stages, world=4):
    s = snap(*stages, pid=1000 + rank)
    return Snapshot(s.stages, dict(s.meta, distributed={"rank": rank, "world_size": world, "local_rank": rank}))


def straggler_job(pre_ms, ar_ms, world=None, steps=STEPS):
    """Per rank: `steps` steps of step/preprocess then step/dist.all_reduce, taking pre_ms[r] and ar_ms[r]."""
    parts = []
    for r, (p, a) in enumerate(zip(pre_ms, ar_ms)):
        parts.append(rank_snap(r, st("step", steps, round((p + a) * MS), self_ns=0),
                               st("step/preprocess", steps, round(p * MS)),
                               st("step/dist.all_reduce", steps, round(a * MS)), world=world or len(pre_ms)))
    return merge_all(parts)


def test_the_straggler_its_stage_and_the_wait_it_caused():
    pre, ar = [1.0, 1.2, 21.0, 0.9], [20.6, 20.3, 0.5, 20.8]
    v = rank_view(straggler_job(pre, ar))
    s = v.straggler
    assert (s.rank, s.path, s.collective) == (2, ("step", "preprocess"), ("step", "dist.all_reduce"))
    assert s.excess_ns == pytest.approx((21.0 - statistics.median([1.0, 1.2, 0.9])) * MS)
    assert s.waits == pytest.approx({0: 20.1 * MS, 1: 19.8 * MS, 3: 20.3 * MS})
    assert s.wait_ns == pytest.approx(20.1 * MS)
    assert s.step_share == pytest.approx(s.excess_ns / (statistics.median(p + a for p, a in zip(pre, ar)) * MS))
    row = v.stage("step/preprocess")
    assert (row.low, row.median, row.high, row.slowest) == pytest.approx(
        (0.9 * MS, statistics.median(pre) * MS, 21.0 * MS, 2))
    assert row.calls == {0: STEPS, 1: STEPS, 2: STEPS, 3: STEPS} and not row.collective and row.wait is None
    coll = v.stage(("step", "dist.all_reduce"))
    assert coll.collective and coll.slowest == 3
    assert coll.wait == pytest.approx({r: (a - 0.5) * MS for r, a in enumerate(ar)})
    assert coll.mean_wait == pytest.approx(statistics.fmean(a - 0.5 for a in ar) * MS)
    assert (v.world_size, v.ranks, v.missing, v.stopped) == (4, (0, 1, 2, 3), (), ())
    assert v.steps == {r: STEPS for r in range(4)} and v.step_path == ("step",) and v.hosts[3] == "testhost"


def test_per_step_is_per_call_of_the_top_level_stage():
    parts = [rank_snap(r, st("step", 5, 10 * MS), st("step/chunk", 20, MS * (3 if r == 1 else 1)),
                       st("step/dist.barrier", 5, MS), world=2) for r in range(2)]
    v = rank_view(merge_all(parts))
    chunk = v.stage("step/chunk")
    assert chunk.per_step == {0: 4 * MS, 1: 12 * MS}        # four calls per step
    assert v.straggler.rank == 1 and v.straggler.excess_ns == 8 * MS


def test_the_following_collective_is_the_next_one_after_the_stage_in_its_step():
    # first seen: step/dist.broadcast, step/forward (with a collective inside), step/forward/inner, then nothing:
    # the wait after forward is in the next step's broadcast, not in the all_reduce inside forward
    parts = [rank_snap(r, st("step", STEPS, 30 * MS), st("step/dist.broadcast", STEPS, (1 if r == 0 else 9) * MS),
                       st("step/forward", STEPS, (12 if r == 0 else 4) * MS, self_ns=STEPS * (10 if r == 0 else 2) * MS),
                       st("step/forward/dist.all_reduce", STEPS, 2 * MS), world=3) for r in range(3)]
    v = rank_view(merge_all(parts))
    s = v.straggler
    assert (s.rank, s.path, s.collective) == (0, ("step", "forward"), ("step", "dist.broadcast"))
    assert s.waits == {1: 8 * MS, 2: 8 * MS} and s.excess_ns == 8 * MS
    alone = rank_view(merge_all([rank_snap(r, st("load", 3, (5 if r else 1) * MS), world=2) for r in range(2)]))
    assert alone.straggler.path == ("load",) and alone.straggler.collective is None and alone.straggler.waits == {}
    assert "no collective follows it" in "\n".join(ranks_summary(alone))


def test_collectives_are_measured_on_the_device_when_every_rank_has_device_time():
    parts = []
    for r in range(2):
        ar = st("step/dist.all_reduce", STEPS, MS // 10)       # NCCL: the host returns at once
        gpu = {"total_ns": STEPS * (25 if r == 0 else 5) * MS, "samples": STEPS}
        parts.append(rank_snap(r, st("step", STEPS, 30 * MS), st("step/preprocess", STEPS, (1 if r == 0 else 21) * MS),
                               type(ar)(**{**ar.__dict__, "gpu": gpu}), world=2))
    v = rank_view(merge_all(parts))
    coll = v.stage("step/dist.all_reduce")
    assert coll.device and coll.per_step == {0: 25 * MS, 1: 5 * MS} and coll.wait == {0: 20 * MS, 1: 0}
    assert v.straggler.rank == 1 and v.straggler.waits == {0: 20 * MS}
    assert "ᵍ device time" in RANKS.render(v)
    parts[1] = rank_snap(1, st("step", STEPS, 30 * MS), st("step/dist.all_reduce", STEPS, MS // 10), world=2)
    assert not rank_view(merge_all(parts)).stage("step/dist.all_reduce").device    # one rank without: host


def test_missing_ranks_ranks_that_stopped_early_and_calls_that_raised():
    parts = [rank_snap(r, st("step", n, 10 * MS, errors=e), st("step/dist.all_reduce", n, MS, errors=e), world=5)
             for r, n, e in ((0, 11, 1), (1, 10, 0), (3, 7, 0), (4, 11, 1))]
    v = rank_view(merge_all(parts))
    assert v.ranks == (0, 1, 3, 4) and v.missing == (2,)
    assert v.steps == {0: 10, 1: 10, 3: 7, 4: 10} and v.stopped == (3,)
    assert v.failed == {("step",): {0: 1, 4: 1}, ("step", "dist.all_reduce"): {0: 1, 4: 1}}
    lines = ranks_summary(v)
    assert "Missing: rank 2: no snapshot" in lines[1] and lines[2].startswith("Stopped early: rank 3 after 7 of 10")
    assert lines[3].startswith("Calls that raised: step on rank 0 (1), rank 4 (1)")


def test_a_snapshot_without_rank_figures_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="no per-rank figures: it was not merged from snapshots that name their rank"):
        rank_view(snap(st("step", 3, MS)).merge(snap(st("step", 3, MS), pid=2)))


def test_text_and_json():
    v = rank_view(straggler_job([1.0, 1.2, 21.0, 0.9], [20.6, 20.3, 0.5, 20.8]))
    out = RANKS.render(v)
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "Straggler: rank 2 in step/preprocess, +20.00 ms per step" in " ".join(out.split())
    assert "waited 20.10 ms per step (median of 3) in step/dist.all_reduce" in " ".join(out.split())
    grid = out.splitlines()[out.splitlines().index("") + 1:]
    row = next(line for line in grid[grid.index(""):] if line.strip().startswith("preprocess"))
    assert row.split() == ["preprocess", "1.00", "1.20", "*21.00", "0.900"]
    d = json.loads(RANKS.render(v, "json"))
    assert d == json.loads(json.dumps(v.to_dict()))
    assert d["straggler"]["rank"] == 2 and d["straggler"]["wait_ns_per_step"] == 20_100_000
    assert d["stages"][2]["wait_ns_per_step"] == {"0": 20_100_000, "1": 19_800_000, "2": 0, "3": 20_300_000}
    wide = rank_view(straggler_job([1.0] * 15 + [9.0], [9.0] * 15 + [1.0]))
    out = RANKS.render(wide)
    assert all(len(line) <= 80 for line in out.splitlines()) and "(--json has all)" in out
    with pytest.raises(ValueError, match="format must be one of table, json"):
        RANKS.render(v, "csv")
