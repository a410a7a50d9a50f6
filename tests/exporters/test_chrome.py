import asyncio
import json
import sys
import textwrap
import threading

import pytest

import instrument
from instrument import cli
from instrument.exporters import chrome
from instrument.snapshot import Snapshot
from snapfactory import cli as run_cli, snap, st


def check_trace(t, stage_names):
    evs = t["traceEvents"]
    xs = [e for e in evs if e["ph"] == "X"]
    assert xs
    for e in xs:
        assert {"ts", "dur", "pid", "tid", "name"} <= set(e) and e["dur"] >= 0
    assert {e["name"] for e in xs} <= stage_names
    by_track = {}
    for e in xs:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in by_track.values():   # intervals on one track nest: a stack never sees a partial overlap
        track.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in track:
            while stack and stack[-1] <= e["ts"] + 1e-3:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + 1e-3, (e, stack)
            stack.append(end)
    ms = [e for e in evs if e["ph"] == "M"]
    assert {e["pid"] for e in ms if e["name"] == "process_name"} == {e["pid"] for e in xs}
    assert {(e["pid"], e["tid"]) for e in ms if e["name"] == "thread_name"} == set(by_track)
    return [e for e in xs if e.get("cat") == "stage"]   # the recorded calls (the slowest calls' lane aside)


def test_live_threads_and_interleaving_tasks(backend):
    instrument.configure(trace_events=10_000, overhead_budget=None)   # every call read: each event has its thread time
    req, tok = instrument.stage("request"), instrument.stage("tokenize")

    def work():
        for _ in range(20):
            with req:
                with tok:
                    pass
    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

    async def task(i):
        with instrument.stage("task"):
            for _ in range(i):
                await asyncio.sleep(0)
            with instrument.stage("inner"):
                pass

    async def many():
        await asyncio.gather(*(task(i) for i in range(5)))
    asyncio.run(many())
    s = instrument.snapshot()
    xs = check_trace(chrome.trace([s]), {"request", "tokenize", "task", "inner"})
    assert sum(e["name"] == "tokenize" for e in xs) == 60 and sum(e["name"] == "task" for e in xs) == 5
    assert len({e["tid"] for e in xs if e["name"] == "request"}) == 3
    assert all("tts" in e and "tdur" in e for e in xs if e["name"] == "tokenize")
    calls = [e for e in chrome.trace([s])["traceEvents"] if e["ph"] == "C" and e["name"] == "calls"]
    assert calls[-1]["args"] == {"request": 60, "task": 5}


def test_no_timeline_is_refused():
    with pytest.raises(chrome.NoTimeline, match="trace_events"):
        chrome.trace([snap(st("a", 3, 1000))])


def test_cli_export_no_timeline_exits_2(tmp_path, capsys):
    snap(st("a", 3, 1000)).save(tmp_path / "a.json")
    assert cli.main(["export", "--chrome", str(tmp_path / "t.json"), str(tmp_path / "a.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no timeline" in err and "--trace-events" in err
    assert not (tmp_path / "t.json").exists()


def test_cli_export_of_a_multiprocess_run(tmp_path):
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import multiprocessing as mp, instrument
        def child():
            with instrument.stage("child"):
                with instrument.stage("leaf"):
                    pass
        if __name__ == "__main__":
            mp.set_start_method("fork")
            with instrument.stage("parent"):
                p = mp.Process(target=child); p.start(); p.join()
    """))
    r = run_cli("run", "--no-report", "-o", tmp_path / "run.json", "--", sys.executable, tmp_path / "app.py")
    assert r.returncode == 0, r.stderr
    r = run_cli("export", "--chrome", tmp_path / "trace.json", tmp_path / "run.json")
    assert r.returncode == 0, r.stderr
    t = json.loads((tmp_path / "trace.json").read_text())
    xs = check_trace(t, {"parent", "child", "leaf"})
    pids = {e["name"]: e["pid"] for e in xs}
    assert pids["child"] == pids["leaf"] != pids["parent"]
    child, parent = (next(e for e in xs if e["name"] == n) for n in ("child", "parent"))
    assert parent["ts"] <= child["ts"] and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"]  # one time axis
    merged = Snapshot.load(tmp_path / "run.json")
    assert len(xs) == len(merged.events) == 3


@pytest.mark.native_only   # the slowest-calls lane is made of exemplars: the C core's
def test_slowest_calls_lane_and_item_counter_tracks(backend, tmp_path):
    """Without trace events too: the slowest calls open in Perfetto on a lane of their own."""
    instrument.configure(exemplars=4, trace_events=0)
    req, pre, fwd, enc = (instrument.stage(n) for n in ("request", "pre", "forward", "encoder"))
    for i in range(60):
        with req:
            with pre:
                if i % 20 == 3:
                    sum(range(200_000))
            with fwd:
                instrument.add("tokens", 8)
                with enc:
                    pass
    s = instrument.snapshot()
    s.save(tmp_path / "s.json")
    r = run_cli("export", "--chrome", tmp_path / "t.json", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    t = json.loads((tmp_path / "t.json").read_text())
    assert check_trace(t, {"request", "pre", "forward", "encoder"}) == []   # no trace events: the lane is all
    lane = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert lane and all(e["tid"] >= chrome.SLOW_TID and e["cat"] == "slowest call" for e in lane)
    names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"] if e["name"] == "thread_name"}
    assert all(n.startswith("slowest calls") for n in names.values())
    roots = sorted((e for e in lane if e["name"] == "request"), key=lambda e: e["ts"])
    slow = sorted((e for e in s.exemplars if e["slow"]), key=lambda e: e["start_ns"])
    assert [round(e["dur"] * 1e3) for e in roots] == [e["wall_ns"] for e in slow]
    for root, ex in zip(roots, slow):
        inside = [e for e in lane if e["tid"] == root["tid"] and root["ts"] <= e["ts"] < root["ts"] + root["dur"]
                  and e is not root]
        own = {tuple(b["path"]): b["wall_ns"] for b in ex["breakdown"]}
        by = {e["args"]["path"]: round(e["dur"] * 1e3) for e in inside}
        assert by["request/pre"] == own[("request", "pre")]
        assert by["request/forward"] == own[("request", "forward")] + own[("request", "forward", "encoder")]
        assert by["request/forward/encoder"] == own[("request", "forward", "encoder")]
    tokens = [e for e in t["traceEvents"] if e["ph"] == "C" and e["name"] == "items: tokens"]
    assert tokens[0]["args"] == {"request/forward": 0} and tokens[-1]["args"] == {"request/forward": 480}
