"""The model: merge, save and load with refusals, immutability, fold."""
import asyncio
import json
import os
import threading
import time

import numpy as np
import pytest

import instrument
from instrument import histogram as _hist
from instrument.snapshot import Snapshot, SnapshotError, StageStats
from conftest import run_python


def stats_from_values(path, values):
    h = {}
    for v in values:
        i = _hist.index(int(v))
        h[i] = h.get(i, 0) + 1
    return StageStats(path, len(values), 0, int(sum(values)), int(sum(values)), int(min(values)), int(max(values)),
                      None, None, 0, h)


def test_merge_equals_snapshot_of_both_workloads():
    rng = np.random.default_rng(7)
    a = rng.lognormal(12, 1, 3000).astype(np.int64)
    b = rng.lognormal(14, 0.5, 5000).astype(np.int64)
    sa = Snapshot([stats_from_values(("req",), a)], {"pid": 1})
    sb = Snapshot([stats_from_values(("req",), b), stats_from_values(("only_b",), b[:10])], {"pid": 2})
    both = Snapshot([stats_from_values(("req",), np.concatenate([a, b])), stats_from_values(("only_b",), b[:10])])
    m = sa.merge(sb)
    bare = [{k: v for k, v in s.to_dict().items() if k != "windows"} for s in m]
    assert bare == [s.to_dict() for s in both]
    # each source stays a window of the merged stage: its calls, sums and median
    w = m["req"].windows
    assert [x["calls"] for x in w] == [3000, 5000] and [x["wall_ns"] for x in w] == [int(a.sum()), int(b.sum())]
    assert [x["p50_ns"] for x in w] == [sa["req"].quantile(0.5), sb["req"].quantile(0.5)]
    assert [x["calls"] for x in m["only_b"].windows] == [10]
    assert m["req"].wall_ns["p99"] == both["req"].wall_ns["p99"]
    assert abs(m["req"].quantile(0.5) - np.percentile(np.concatenate([a, b]), 50)) / np.percentile(
        np.concatenate([a, b]), 50) < 0.01
    assert [x["pid"] for x in m.meta["merged_from"]] == [1, 2]


def test_merge_leaves_the_snapshots_merged_as_they_were():
    exits = {"unmatched_exits": 1, "out_of_order_exits": 0, "cross_thread_exits": 2}
    a = Snapshot([stats_from_values(("req",), [5, 7])], {"pid": 1, "exits": exits})
    b = Snapshot([stats_from_values(("req",), [9])], {"pid": 2, "exits": exits})
    before = a.to_dict(), b.to_dict()
    assert a.merge(b).meta["exits"] == {"unmatched_exits": 2, "out_of_order_exits": 0, "cross_thread_exits": 4}
    assert (a.to_dict(), b.to_dict()) == before


def test_merge_of_live_processes_counts_exactly(tmp_path):
    code = ("import instrument, sys\nn=int(sys.argv[1]) if len(sys.argv)>1 else 0\n"
            "for i in range({n}):\n    with instrument.stage('req'):\n        with instrument.stage('tok'): pass\n")
    for name, n in (("a", 30), ("b", 45)):
        r = run_python(code.format(n=n), env={"INSTRUMENT_OUTPUT": str(tmp_path / f"{name}.json")})
        assert r.returncode == 0, r.stderr
    m = Snapshot.load(tmp_path / "a.json").merge(Snapshot.load(tmp_path / "b.json"))
    assert m["req"].calls == 75 and m["req/tok"].calls == 75
    assert m["req"].wall_total == Snapshot.load(tmp_path / "a.json")["req"].wall_total + \
        Snapshot.load(tmp_path / "b.json")["req"].wall_total


# ------------------------------------------------------------- save and load
def test_save_load_round_trip(tmp_path, backend):
    with instrument.stage("request"):
        for _ in range(20):
            with instrument.stage("tokenize"):
                pass
    s = instrument.snapshot()
    f = s.save(tmp_path / "run.json")
    d = json.load(open(f))
    assert d["format"] == "instrument-snapshot" and d["version"] == 1
    st = d["stages"][1]
    assert st["path"] == ["request", "tokenize"] and st["calls"] == 20
    assert set(st["wall_ns"]) >= {"total", "self", "min", "max"} and st["hist"]["buckets"]
    assert not {"p50", "p90", "p99"} & set(st["wall_ns"])       # derived from the histogram: loading computes them
    assert set(s.to_dict()["stages"][1]["wall_ns"]) >= {"p50", "p90", "p99"}   # what to_json() gives holds them
    assert set(st["cpu_ns"]) >= {"total", "self"} and "counters" in st
    back = Snapshot.load(f)
    assert back == s and back.to_dict() == s.to_dict()
    assert back.meta["pid"] == os.getpid() and "python" in back.meta and "counters" in back.meta


def test_a_file_in_the_full_form_written_before_loads_to_the_same_snapshot(tmp_path, backend):
    """save() leaves out what loading derives (percentiles, verdicts, a counter's derived fields, zero parts of the
    split) and writes compact JSON; files written before held all of it, as to_json() still gives it, indented or
    not. Both load to the same snapshot, verdicts included, and the compact file is the smaller."""
    with instrument.stage("request"):
        for _ in range(20):
            with instrument.stage("tokenize"):
                sum(range(2000))
    s = instrument.snapshot()
    compact, full = tmp_path / "now.json", tmp_path / "before.json"
    s.save(compact)
    full.write_text(s.to_json(indent=1))
    a, b = Snapshot.load(compact), Snapshot.load(full)
    assert a == b == s and a["request/tokenize"].verdict == s["request/tokenize"].verdict is not None
    saved = json.loads(compact.read_text())["stages"][1]
    assert "verdict" not in saved and "p50" not in saved["wall_ns"]
    assert all(c is None or "running_fraction" not in c for c in saved["counters"].values())
    assert os.path.getsize(compact) < 0.6 * os.path.getsize(full)


def test_snapshot_is_immutable(backend):
    with instrument.stage("x"):
        pass
    s = instrument.snapshot()
    with pytest.raises(Exception):
        s.stages[0].calls = 3
    m = s.meta
    m["pid"] = -1
    assert s.meta["pid"] == os.getpid()


@pytest.mark.parametrize("content,msg", [
    (b"", "empty"), (b"{\"format\": \"instrument-snapshot\", \"ver", "not valid JSON"),
    (b"\x00\xff\xfe binary", "not UTF-8"), (b"[1,2]", "JSON object"),
    (b'{"format": "other", "version": 1, "stages": []}', "not an instrument snapshot"),
    (b'{"format": "instrument-snapshot", "version": 99, "stages": []}', "newer than this instrument reads"),
    (b'{"format": "instrument-snapshot", "version": 1, "stages": [{"path": []}]}', "path must be"),
])
def test_load_bad_files(tmp_path, content, msg):
    f = tmp_path / "bad.json"
    f.write_bytes(content)
    with pytest.raises(SnapshotError, match=msg):
        Snapshot.load(f)


def test_load_missing_file(tmp_path):
    with pytest.raises(SnapshotError, match="cannot read"):
        Snapshot.load(tmp_path / "nope.json")


def test_save_failure_keeps_previous_file(tmp_path):
    # RLIMIT_FSIZE makes the write fail with EFBIG even for root
    f = tmp_path / "run.json"
    code = f"""
import instrument, resource, signal, errno
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
with instrument.stage("small"):
    pass
instrument.snapshot().save({str(f)!r})
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
for i in range(300):
    with instrument.stage("stage_with_a_long_name_%d" % i):
        pass
try:
    instrument.snapshot().save({str(f)!r})
except OSError as e:
    print("failed", errno.errorcode[e.errno])
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "failed EFBIG"
    snap = Snapshot.load(f)
    assert [s.path for s in snap] == [("small",)]
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]   # no temporary file left behind




def test_fold_by_name(backend):
    for parent in ("request", "batch"):
        with instrument.stage(parent):
            with instrument.stage("tokenize"):
                pass
    f = instrument.snapshot().fold()
    assert f["tokenize"].calls == 2 and f["request"].calls == 1


def test_since_is_exactly_the_window(tmp_path):
    rng = np.random.default_rng(3)
    early, late = rng.lognormal(12, 1, 2000).astype(np.int64), rng.lognormal(14, 0.7, 3000).astype(np.int64)
    meta = {"pid": 7, "host": "h", "start_time": 1.0, "end_time": 2.0, "duration_ns": 1_000_000_000}
    a = Snapshot([stats_from_values(("req",), early)], meta)
    b = Snapshot([stats_from_values(("req",), np.concatenate([early, late])),
                  stats_from_values(("req", "new"), late[:10])], dict(meta, end_time=3.0, duration_ns=2_000_000_000))
    w = b.since(a)
    assert w["req"].calls == len(late) and w["req"].wall_total == int(late.sum())
    for q in (0.5, 0.9, 0.99):
        assert abs(w["req"].quantile(q) - np.percentile(late, q * 100)) / np.percentile(late, q * 100) < 0.01
    assert w["req", "new"].calls == 10 and w.meta["window"]["duration_ns"] == 1_000_000_000
    assert w["req"].wall_min <= late.min() and w["req"].wall_max >= late.max()
    with pytest.raises(SnapshotError, match="different processes"):
        b.since(Snapshot([], dict(meta, pid=8)))
    with pytest.raises(SnapshotError, match="taken after this one"):
        a.since(b)
    with pytest.raises(SnapshotError, match="reset between"):
        b.since(Snapshot([], dict(meta, start_time=1.5)))


def test_task_attribution_fields_round_trip_merge_and_window(tmp_path):
    """overlapped, abandoned and suspended time survive save/load, add up in a merge and subtract in a window;
    ratios to wall time leave the overlapped calls out."""
    from dataclasses import replace

    from snapfactory import snap, st
    a = replace(st("req", 10, 1_000_000, cpu_ns=4_000_000), cpu_calls=8, overlapped_calls=2, abandoned_calls=1,
                suspended_total=3_000_000, suspended_self=2_000_000)
    s1 = snap(a)
    path = tmp_path / "s.json"
    s1.save(path)
    d = Snapshot.load(path)["req"]
    assert (d.overlapped_calls, d.abandoned_calls, d.suspended_total, d.suspended_self) == (2, 1, 3_000_000, 2_000_000)
    raw = s1.to_dict()["stages"][0]
    assert raw["cpu_ns"]["overlapped_calls"] == 2 and raw["suspended_ns"] == {"total": 3_000_000, "self": 2_000_000}
    assert "suspended_ns" not in snap(st("plain", 1, 5)).to_dict()["stages"][0]      # absent when 0
    assert a.attributed_wall() == 10_000_000 * 8 / 10
    assert abs(a.suspended_share - 2_000_000 / 8_000_000) < 1e-9
    m = s1.merge(snap(a, pid=1001))["req"]
    assert (m.overlapped_calls, m.abandoned_calls, m.suspended_total, m.suspended_self) == (4, 2, 6_000_000, 4_000_000)
    later = replace(a, calls=20, wall_total=20_000_000, wall_self=20_000_000, cpu_calls=16, overlapped_calls=5,
                    suspended_total=7_000_000, suspended_self=5_000_000,
                    hist={k: 2 * v for k, v in a.hist.items()})
    w = snap(later).since(s1)["req"]
    assert (w.calls, w.overlapped_calls, w.suspended_total, w.suspended_self) == (10, 3, 4_000_000, 3_000_000)


@pytest.mark.native_only   # the fallback splits no wall time
def test_the_parts_of_the_wall_split_add_up_to_the_wall_time(backend):
    """A reader that sums the parts of `wall_split_ns` gets each stage's wall time, total and self, in a real
    recording (nesting, a thread, asyncio): the running time CPU time covers is beside the split, not a part."""
    def spin(ns):
        t = time.thread_time_ns()
        while time.thread_time_ns() - t < ns:
            pass

    def request():
        with instrument.stage("request"):
            with instrument.stage("compute"):
                spin(300_000)
            with instrument.stage("io"):
                time.sleep(0.001)

    async def handler():
        with instrument.stage("handler"):
            await asyncio.sleep(0.001)
            spin(200_000)

    async def main():
        await asyncio.gather(*(handler() for _ in range(4)))

    for _ in range(10):
        request()
    t = threading.Thread(target=lambda: [request() for _ in range(5)])
    t.start()
    t.join()
    asyncio.run(main())
    stages = [s for s in instrument.snapshot().to_dict()["stages"] if s["calls"]]
    assert {tuple(s["path"]) for s in stages} >= {("request", "io"), ("handler",)}
    for s in stages:
        split = s["wall_split_ns"]
        assert set(split) <= {"on_cpu", "runqueue", "blocked", "gil", "instrument", "awaiting", "loop_ready", "unknown"}
        for k in ("total", "self"):
            assert sum(p[k] for p in split.values()) == pytest.approx(s["wall_ns"][k], rel=1e-9, abs=2), (s, k)
        covered = sum(split[p]["total"] for p in ("on_cpu", "runqueue", "blocked", "gil", "instrument") if p in split)
        assert s["covered_running_ns"]["total"] == pytest.approx(covered, rel=1e-9, abs=2)


def test_files_with_covered_running_inside_the_split_still_load(backend):
    """Files written before covered_running left the split: it is read from there and written beside it."""
    with instrument.stage("s"):
        t = time.thread_time_ns()
        while time.thread_time_ns() - t < 200_000:
            pass
    new = instrument.snapshot().to_dict()
    old = json.loads(json.dumps(new))
    st = old["stages"][0]
    st["wall_split_ns"]["covered_running"] = st.pop("covered_running_ns")
    loaded = Snapshot.from_dict(old)
    assert loaded["s"].covered_run == new["stages"][0]["covered_running_ns"]["total"] > 0
    assert loaded.to_dict() == Snapshot.from_dict(new).to_dict()
    assert "covered_running" not in loaded.to_dict()["stages"][0]["wall_split_ns"]


@pytest.mark.native_only   # it checks the exemplars of the interval too: the C core's
def test_since_of_a_live_process_is_exactly_the_interval(backend):
    """Two snapshots of this process: the window has the calls made between them, its percentiles those of
    the durations the trace ring recorded for that interval (within the histogram's error)."""
    instrument.configure(trace_events=50_000, counters="none")
    rng = np.random.default_rng(11)
    req = instrument.stage("req")

    def run(n, scale):
        for k in rng.lognormal(scale, 1.0, n).astype(int):
            with req:
                sum(range(k))
                instrument.add("rows", int(k))
    run(3000, 3)
    a = instrument.snapshot()
    run(5000, 5)
    b = instrument.snapshot()
    w = b.since(a)
    seen = {(e["ts_ns"], e["dur_ns"]) for e in a.events}
    interval = np.array([e["dur_ns"] for e in b.events if (e["ts_ns"], e["dur_ns"]) not in seen])
    assert len(interval) == 5000 and w["req"].calls == 5000
    assert w["req"].wall_total == int(interval.sum())
    for q in (0.5, 0.9, 0.99):
        want = np.percentile(interval, q * 100)
        assert abs(w["req"].quantile(q) - want) / want < 0.01, q
    assert w["req"].items["rows"]["calls"] == 5000
    assert all(e["start_ns"] >= a.meta["duration_ns"] for e in w.exemplars) and w.exemplars
    assert len(w.events) == 5000


def test_since_refuses_other_processes_in_one_line(tmp_path):
    from snapfactory import cli
    code = "import instrument, sys\nwith instrument.stage('s'): pass\ninstrument.snapshot().save(sys.argv[1])"
    for name in ("a.json", "b.json"):
        r = run_python(f"import sys; sys.argv = ['x', {str(tmp_path / name)!r}]\n" + code)
        assert r.returncode == 0, r.stderr
    r = cli("report", "--since", tmp_path / "a.json", tmp_path / "b.json")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "different processes" in r.stderr, r.stderr


def test_items_and_exemplars_round_trip_and_refuse_bad_entries():
    s = StageStats(("req",), 2, 0, 30, 10, 10, 20, None, None, 0, {10: 1, 20: 1},
                   items={"tokens": {"total": 12, "calls": 2}, "bytes": {"total": 1.5, "calls": 1}})
    ex = [{"path": ["req"], "wall_ns": 20, "start_ns": 5, "pid": 1, "tid": 1, "seq": 2, "slow": True, "sample": False,
           "breakdown": [{"path": ["req"], "wall_ns": 20}]}]
    snap = Snapshot([s], {"pid": 1}, None, ex)
    back = Snapshot.from_dict(json.loads(snap.to_json()))
    assert back == snap and back["req"].items == s.items and back.exemplars == tuple(ex)
    d = json.loads(snap.to_json())
    d["stages"][0]["items"]["tokens"]["total"] = -1
    with pytest.raises(SnapshotError, match="item 'tokens' needs a total >= 0"):
        Snapshot.from_dict(d)
    d = json.loads(snap.to_json())
    d["exemplars"][0]["path"] = ["req", "sub"]
    with pytest.raises(SnapshotError, match="exemplar path must be a one-name list"):
        Snapshot.from_dict(d)
    d["exemplars"] = {"x": 1}
    with pytest.raises(SnapshotError, match="'exemplars' must be a list"):
        Snapshot.from_dict(d)


def _ex(pid, seq, wall, slow, sample, root="req"):
    return {"path": [root], "wall_ns": wall, "start_ns": seq, "pid": pid, "tid": pid, "seq": seq, "slow": slow,
            "sample": sample, "breakdown": [{"path": [root], "wall_ns": wall}]}


def test_merge_keeps_the_slowest_exemplars_and_samples_by_calls():
    k = 4
    a_walls, b_walls = [5, 9, 11, 30], [7, 8, 40, 50]
    a = Snapshot([stats_from_values(("req",), list(range(1, 301)))], {"pid": 1},
                 None, [_ex(1, i, w, True, False) for i, w in enumerate(a_walls)]
                 + [_ex(1, 100 + i, 2, False, True) for i in range(k)])
    b = Snapshot([stats_from_values(("req",), list(range(1, 101)))], {"pid": 2},
                 None, [_ex(2, i, w, True, False) for i, w in enumerate(b_walls)]
                 + [_ex(2, 100 + i, 3, False, True) for i in range(k)])
    m = a.merge(b)
    assert sorted(e["wall_ns"] for e in m.exemplars if e["slow"]) == sorted(a_walls + b_walls)[-k:]
    samples = [e for e in m.exemplars if e["sample"]]
    assert len(samples) == k and sum(e["pid"] == 1 for e in samples) == 3   # 300 calls against 100: 3 to 1
    assert m["req"].calls == 400
