"""`instrument merge --by-rank` and `instrument report --ranks` on files with known numbers: what is
checked, what is left out, and the one-line errors."""
import json

from instrument import cli
from instrument.serve import multiproc
from instrument.snapshot import Snapshot, merge_all
from snapfactory import snap, st

MS = 1_000_000


def rank_file(tmp_path, rank, calls=10, world=2, pid=None, end=None, name=None):
    s = snap(st("step", calls, 10 * MS), st("step/work", calls, (5 if rank else 1) * MS), pid=pid or 100 + rank)
    meta = dict(s.meta, distributed={"rank": rank, "world_size": world, "local_rank": rank})
    if end is not None:
        meta.update(end_time=meta["start_time"] + end, duration_ns=int(end * 1e9))
    path = tmp_path / (name or f"rank{rank}.json")
    Snapshot(s.stages, meta).save(path)
    return path


def main(capsys, *args):
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def error(capsys, *args):
    rc, out, err = main(capsys, *args)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("instrument: "), err
    return err


def test_merge_by_rank_of_files_folders_and_writer_files(tmp_path, capsys):
    a, b = rank_file(tmp_path, 0), rank_file(tmp_path, 1)
    launcher = tmp_path / "launcher.json"
    snap(pid=7).save(launcher)                                    # torchrun's own process: no rank, no stage
    rc, _, err = main(capsys, "merge", "--by-rank", a, b, launcher, "-o", tmp_path / "m.json")
    assert rc == 0 and "2 processes" in err and "Left out (no rank and no calls" in err and "launcher.json" in err
    m = Snapshot.load(tmp_path / "m.json")
    assert {r: f["calls"] for r, f in m["step/work"].ranks.items()} == {0: 10, 1: 10}
    assert sorted(x["rank"] for x in m.meta["merged_from"]) == [0, 1]

    folder = tmp_path / "writer"
    folder.mkdir()
    f = multiproc.SnapshotFile(str(folder / "instrument-101-abcd.snap"))   # rank 1's writer file, an earlier state
    early = Snapshot.load(rank_file(tmp_path, 1, calls=4, end=30, name="early.json"))
    f.write(early.to_json().encode())
    f.close()
    rank_file(tmp_path, 1, calls=10, end=60, name="late.json")
    rc, _, err = main(capsys, "merge", "--by-rank", a, folder, tmp_path / "late.json", "-o", tmp_path / "w.json")
    assert rc == 0 and "instrument-101-abcd.snap" in err, err          # the earlier snapshot of that process left out
    assert Snapshot.load(tmp_path / "w.json")["step"].ranks[1]["calls"] == 10
    rc, out, _ = main(capsys, "report", "--ranks", "--json", a, folder)
    assert rc == 0 and json.loads(out)["steps"] == {"0": 10, "1": 4}


def test_report_ranks_table_and_json(tmp_path, capsys):
    m = tmp_path / "m.json"
    merge_all([Snapshot.load(rank_file(tmp_path, r, world=3)) for r in (0, 1)]).save(m)
    rc, out, _ = main(capsys, "report", "--ranks", m)
    assert rc == 0 and out.startswith("Ranks: 2 of a world of 3 on 1 host")
    assert "Missing: rank 2: no snapshot" in out and "Straggler: rank 1 in step/work, +4.00 ms per step" in out
    rc, out, _ = main(capsys, "report", "--ranks", "--json", m)
    d = json.loads(out)
    assert rc == 0 and d["missing"] == [2] and d["straggler"]["excess_ns_per_step"] == 4 * MS


def test_what_is_refused(tmp_path, capsys):
    a = rank_file(tmp_path, 0)
    plain = tmp_path / "plain.json"
    snap(st("step", 3, MS), pid=9).save(plain)
    assert "plain.json names no rank" in error(capsys, "merge", "--by-rank", a, plain, "-o", tmp_path / "x.json")
    other = rank_file(tmp_path, 1, world=8, name="other.json")
    err = error(capsys, "merge", "--by-rank", a, other)
    assert "is of a world of 2 ranks but" in err and "of 8: files of different jobs" in err
    m = tmp_path / "m.json"
    merge_all([Snapshot.load(a), Snapshot.load(rank_file(tmp_path, 1))]).save(m)
    assert "give the merge or its parts, not both" in error(capsys, "merge", "--by-rank", m, a)
    snap(pid=7).save(tmp_path / "launcher.json")
    assert "none of the files names a rank" in error(capsys, "report", "--ranks", tmp_path / "launcher.json")
    err = error(capsys, "report", "--ranks", "--format", "csv", a)
    assert "--format csv is not available; use table or json" in err
    assert "does not go with --since, --tail or --ops" in error(capsys, "report", "--ranks", "--tail", a)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "a folder with no snapshot files" in error(capsys, "report", "--ranks", empty)
    f = multiproc.SnapshotFile(str(tmp_path / "instrument-5-ffff.snap"))
    f.close()
    assert "had written no snapshot into it yet" in error(capsys, "merge", "--by-rank", tmp_path / "instrument-5-ffff.snap")
