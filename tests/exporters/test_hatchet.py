import json

import pytest

hatchet = pytest.importorskip("hatchet")

import instrument  # noqa: E402
from instrument import cli  # noqa: E402
from instrument.exporters.hatchet import to_literal  # noqa: E402
from snapfactory import snap, st  # noqa: E402

MS = 1_000_000


def test_literal_loads_with_hatchet_and_time_inc_equals_totals(tmp_path):
    s = snap(st("request", 10, 25 * MS, self_ns=40 * MS, counters={"page-faults": {"total": 9}}),
             st("request/tokenize", 10, 3 * MS), st("request/model", 10, 18 * MS),
             st("request/model/tokenize", 5, 1 * MS), st("batch", 2, 7 * MS))
    s.save(tmp_path / "s.json")
    assert cli.main(["export", "--hatchet", str(tmp_path / "h.json"), str(tmp_path / "s.json")]) == 0
    gf = hatchet.GraphFrame.from_literal(json.loads((tmp_path / "h.json").read_text()))
    seen = {}
    for node in gf.graph.traverse():
        path = tuple(n.frame["name"] for n in node.path())
        row = gf.dataframe.loc[node]
        seen[path] = row
    assert set(seen) == {x.path for x in s}
    for x in s:
        assert seen[x.path]["time (inc)"] == pytest.approx(x.wall_total / 1e9)
        assert seen[x.path]["time"] == pytest.approx(x.wall_self / 1e9)
        assert seen[x.path]["calls"] == x.calls
    assert seen[("request",)]["page-faults"] == 9
    assert [r.frame["name"] for r in gf.graph.roots] == ["request", "batch"]


def test_live_snapshot(backend):
    for _ in range(3):
        with instrument.stage("a"):
            with instrument.stage("b"):
                pass
    s = instrument.snapshot()
    gf = hatchet.GraphFrame.from_literal(to_literal(s))
    (root,) = gf.graph.roots
    assert gf.dataframe.loc[root]["time (inc)"] == pytest.approx(s["a"].wall_total / 1e9)
    assert gf.dataframe.loc[root.children[0]]["calls"] == 3


def test_items_are_hatchet_metrics(backend):
    for _ in range(3):
        with instrument.stage("a"):
            with instrument.stage("b"):
                instrument.add("tokens", 5)
    gf = hatchet.GraphFrame.from_literal(to_literal(instrument.snapshot()))
    vals = {tuple(n.frame["name"] for n in node.path()): gf.dataframe.loc[node]["items: tokens"]
            for node in gf.graph.traverse()}
    assert vals[("a", "b")] == 15
    assert vals[("a",)] is None or vals[("a",)] != vals[("a",)]   # none in `a` (null; pandas may read NaN)
