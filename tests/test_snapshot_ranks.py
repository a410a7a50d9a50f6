"""Per-rank figures in the model: made by merge() from snapshots that name their rank, and kept exactly
through save/load, merge, since and fold."""
import json

import pytest

from instrument.snapshot import (RANK_FIELDS, Snapshot, SnapshotError, merge_all, rank_figures, rank_of)
from snapfactory import snap, st

MS = 1_000_000


def rank_snap(rank, *stages, world=4, pid=None, start=1_700_000_000.0, end=None):
    s = snap(*stages, pid=1000 + rank if pid is None else pid, start=start)
    meta = dict(s.meta, distributed={"rank": rank, "world_size": world, "local_rank": rank % 2})
    if end is not None:
        meta.update(end_time=end, duration_ns=round((end - start) * 1e9))
    return Snapshot(s.stages, meta)


def job(calls=(10, 10, 10), per_call=(MS, 2 * MS, 3 * MS), **kw):
    """One snapshot per rank: `step` with `step/work` (rank r: calls[r] calls of per_call[r] ns)."""
    return [rank_snap(r, st("step", n, ns + MS, self_ns=n * MS), st("step/work", n, ns, errors=r), **kw)
            for r, (n, ns) in enumerate(zip(calls, per_call))]


def test_merge_keeps_each_ranks_figures_which_add_up_to_the_totals():
    parts = job()
    m = parts[0].merge(*parts[1:])
    work = m["step/work"]
    assert work.ranks == {r: rank_figures(p["step/work"]) for r, p in enumerate(parts)}
    assert work.ranks[1] == {"calls": 10, "errors": 1, "wall_ns": 20 * MS, "self_ns": 20 * MS, "cpu_ns": None,
                             "gpu_ns": None}
    for s in m.stages:
        for f in ("calls", "errors", "wall_ns", "self_ns"):
            total = {"calls": s.calls, "errors": s.errors, "wall_ns": s.wall_total, "self_ns": s.wall_self}[f]
            assert sum(x[f] for x in s.ranks.values()) == total
    assert [(x["pid"], x["rank"], x["local_rank"], x["world_size"]) for x in m.meta["merged_from"]] == \
        [(1000, 0, 0, 4), (1001, 1, 1, 4), (1002, 2, 0, 4)]
    assert "distributed" not in m.meta and rank_of(m.meta) is None     # one process's rank: not the merge's
    assert [rank_of(p.meta) for p in parts] == [0, 1, 2]


def test_snapshots_that_name_no_rank_keep_no_rank_figures():
    a, b = snap(st("req", 3, MS), pid=1), snap(st("req", 2, MS), pid=2)
    m = a.merge(b)
    assert m["req"].ranks is None and "ranks" not in json.loads(m.to_json())["stages"][0]
    assert set(m.meta["merged_from"][0]) == {"pid", "host", "start_time", "end_time"}
    one = merge_all([rank_snap(3, st("req", 2, MS))])            # one rank alone: a merge of one
    assert one["req"].ranks == {3: rank_figures(st("req", 2, MS))} and len(one.meta["merged_from"]) == 1
    assert merge_all([a]) == a


def test_rank_figures_survive_save_load_merge_and_fold(tmp_path):
    parts = job(calls=(4, 5, 6, 7), per_call=(MS, MS, 9 * MS, MS))
    whole = merge_all(parts)
    whole.save(tmp_path / "w.json")
    back = Snapshot.load(tmp_path / "w.json")
    assert back == whole and back["step/work"].ranks == whole["step/work"].ranks
    halves = merge_all(parts[:2]).merge(merge_all(parts[2:]))
    for s in whole.stages:
        assert halves[s.path].ranks == s.ranks and halves[s.path].calls == s.calls
    again = whole.merge(merge_all([rank_snap(2, st("step/work", 1, 5 * MS), pid=77)]))   # rank 2 restarted
    assert again["step/work"].ranks[2]["calls"] == 7 and again["step/work"].ranks[2]["wall_ns"] == 6 * 9 * MS + 5 * MS
    folded = whole.fold()
    assert folded["work"].ranks == whole["step/work"].ranks


def test_since_of_merges_is_each_ranks_window():
    early = job(calls=(10, 10, 10), end=1_700_000_030.0)
    late = job(calls=(25, 24, 30), end=1_700_000_060.0)
    w = merge_all(late).since(merge_all(early))
    work = w["step/work"]
    assert {r: f["calls"] for r, f in work.ranks.items()} == {0: 15, 1: 14, 2: 20}
    assert work.ranks[2]["wall_ns"] == 20 * 3 * MS and work.calls == 49
    assert work.windows is None and w.meta["window"]["duration_ns"] is None and not w.events
    assert w["step"].ranks[1]["self_ns"] == 14 * MS
    with pytest.raises(SnapshotError, match="left the merge"):           # a rank that restarted: a new window
        merge_all([late[0], late[1]]).since(merge_all(early))
    backwards = merge_all([rank_snap(0, st("step", 30, MS), pid=1000), rank_snap(1, st("step", 1, MS))])
    with pytest.raises(SnapshotError, match="rank 1 has 10 calls before and 1 after"):
        backwards.since(merge_all([rank_snap(0, st("step", 10, MS), pid=1000),
                                         rank_snap(1, st("step", 10, MS))]))


@pytest.mark.parametrize("entry, why", [
    ({"rank": -1}, "a ranks entry needs a rank"),
    ({"rank": True}, "a ranks entry needs a rank"),
    ({"calls": 1.5}, "calls and errors"),
    ({"errors": None}, "calls and errors"),
    ({"wall_ns": None}, "wall_ns and self_ns"),
    ({"gpu_ns": "fast"}, "gpu_ns >= 0 or null"),
])
def test_bad_ranks_entries_are_refused_in_one_line(entry, why):
    d = json.loads(merge_all(job()).to_json())
    d["stages"][1]["ranks"][0].update(entry)
    with pytest.raises(SnapshotError, match=why) as e:
        Snapshot.from_dict(d)
    assert "\n" not in str(e.value) and "step/work" in str(e.value)
    d = json.loads(merge_all(job()).to_json())
    d["stages"][1]["ranks"].append(dict(d["stages"][1]["ranks"][0]))
    with pytest.raises(SnapshotError, match=r"a ranks entry needs a rank \(once\)"):
        Snapshot.from_dict(d)
    d["stages"][1]["ranks"] = {"0": {}}
    with pytest.raises(SnapshotError, match="ranks must be a list of objects"):
        Snapshot.from_dict(d)


def test_every_rank_field_is_written_and_read():
    d = json.loads(merge_all(job()).to_json())
    assert [set(x) for x in d["stages"][1]["ranks"]] == [{"rank", *RANK_FIELDS}] * 3
