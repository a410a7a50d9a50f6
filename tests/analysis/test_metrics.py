"""The metrics registry: each figure against numbers computed here from the raw
values, ratios of sums; a metric added to the registry shows in the table, CSV,
JSON, the HTML report and `instrument top`, and sorts the same everywhere."""
import csv
import html as htmllib
import io
import json
import os
import re

import numpy as np
import pytest

from instrument import cli, top
from instrument.analysis import metrics
from instrument.analysis.metrics import Bar, Metric
from instrument.analysis.verdict import with_verdicts
from instrument.exporters import csv as as_csv, html, json as as_json, table
from snapfactory import ROOT, snap, st
from browser import browse, chromium  # noqa: F401

MS = 1_000_000


# --------------------------------------------------------------- the figures
def test_counter_ratios_are_ratios_of_sums_not_means_of_ratios():
    a = snap(st("s", 10, MS, counters={"instructions": {"total": 1000}, "cycles": {"total": 1000}}))
    b = snap(st("s", 30, MS, counters={"instructions": {"total": 27000}, "cycles": {"total": 3000}}), pid=2)
    both = a.merge(b)
    ipc = metrics.METRICS["ipc"]
    assert ipc.value(a, a["s"]) == 1.0 and ipc.value(b, b["s"]) == 9.0
    assert ipc.value(both, both["s"]) == 28000 / 4000 != (1.0 + 9.0) / 2


def test_each_figure_against_the_raw_values():
    rng = np.random.default_rng(3)
    walls = [int(v) for v in rng.lognormal(np.log(2 * MS), 0.5, 4000)]
    ctr = {"page-faults": {"total": 800}, "context-switches": {"total": 40}, "cache-misses": {"total": 30},
           "cache-references": {"total": 600}, "instructions": {"total": 90_000}, "branches": {"total": 5000},
           "branch-misses": {"total": 125}}
    s = snap(st("req", 0, 0, values=walls, self_ns=sum(walls) // 4, cpu_ns=sum(walls) // 2, counters=ctr),
             st("req/model", 1000, MS))
    req, model = s["req"], s["req/model"]
    got = {m.name: m.value(s, req) for m in metrics.METRICS.values()}
    assert got["calls"] == 4000 and got["total"] == sum(walls) and got["mean"] == pytest.approx(np.mean(walls))
    assert got["p50"] == pytest.approx(np.percentile(walls, 50), rel=0.01)
    assert got["p99"] == pytest.approx(np.percentile(walls, 99), rel=0.01)
    assert got["self"] == sum(walls) // 4 and got["cpu"] == sum(walls) // 2
    assert got["cpu_per_wall"] == pytest.approx(0.5) and got["root"] == 1.0
    assert metrics.METRICS["root"].value(s, model) == pytest.approx(1000 * MS / sum(walls))
    assert got["cache_miss"] == pytest.approx(30 / 600) and got["mpki"] == pytest.approx(1000 * 30 / 90_000)
    assert got["branch_miss"] == pytest.approx(125 / 5000) and got["ipc"] is None          # no cycles counted
    assert got["page_faults"] == 800 and got["page_faults_per_call"] == pytest.approx(800 / 4000)
    assert got["context_switches_per_call"] == pytest.approx(40 / 4000)
    assert got["tail"] is None and got["gpu"] is None and got["verdict"] is None
    assert {m.name for m in metrics.wanted(s)} >= {"calls", "cache_miss", "page_faults_per_call"}
    assert "ipc" not in {m.name for m in metrics.wanted(s)} and "gpu" not in {m.name for m in metrics.wanted(s)}


def test_fields_and_exported_units():
    root = metrics.METRICS["root"]
    assert (root.field, root.exported(0.84)) == ("root_pct", 84.0)       # a fraction, exported in percent
    assert metrics.METRICS["total"].field == "total_ns" and metrics.METRICS["ipc"].field == "ipc"
    with pytest.raises(ValueError, match="unit must be one of ns, pct, count, ratio, text, bytes, got 'ms'"):
        Metric("bad", "bad", "ms", "ms", lambda n, s: 1, "a bad unit")
    with pytest.raises(ValueError, match="a metric named 'total' exists already"):
        metrics.register(Metric("total", "t", "ns", "ms", lambda n, s: 1, "again"))


def test_the_prometheus_docs_give_every_metric_in_promql():
    text = open(os.path.join(ROOT, "docs", "prometheus.md"), encoding="utf-8").read()
    assert metrics.describe() in text, "docs/prometheus.md: paste the output of instrument.analysis.metrics.describe()"


# ------------------------------------------------------------- a new metric
@pytest.fixture
def toys():
    """Three metrics as a later module would add them: a ratio of sums, a split into parts, an error bar."""
    added = [Metric("errs", "err/call", "ratio", "ratio", lambda n, s: s.errors / s.calls if s.calls else None,
                    "errors per call", estimated=lambda s: s.cpu_estimated),
             Metric("split", "own ms / kids ms", "ns", "ms",
                    lambda n, s: {"own": s.wall_self, "kids": s.wall_total - s.wall_self}, "wall time, own and "
                    "in child stages", width=22),
             Metric("spread", "mean±half range ms", "ns", "ms",
                    lambda n, s: Bar(s.wall_mean, (s.wall_max - s.wall_min) / 2) if s.calls else None,
                    "mean wall time, and half its range")]
    for m in added:
        metrics.register(m)
    yield added
    for m in added:
        del metrics.METRICS[m.name]


def toy_snapshot():
    from dataclasses import replace
    return snap(st("request", 0, 0, values=[10 * MS] * 6 + [30 * MS] * 2, errors=2, self_ns=16 * MS),
                replace(st("request/model", 8, 8 * MS, errors=1, cpu_ns=40 * MS), cpu_read_calls=4),
                st("request/io", 8, 2 * MS, errors=4))


def test_a_new_metric_shows_in_table_csv_and_json(toys):
    s = toy_snapshot()
    lines = table.render([s], width=400).splitlines()
    head = lines[0]
    assert "err/call" in head and "own ms / kids ms" in head and "mean±half range ms" in head
    req = lines[2]
    assert "0.25" in req and "own 16.00 kids 104.0" in req and "15.00±10.00" in req   # 2 errors of 8; 120 ms
    model = next(x for x in lines if x.strip().startswith("model "))
    assert "~0.12" in model                                        # estimated, as the metric says, and marked
    narrow = table.render([s], width=80)
    foot = " ".join(narrow[narrow.index("not shown at 80 columns"):].split())
    assert "err/call" in foot and "err/call" not in narrow.splitlines()[0]        # named, not shown
    rows = {r["path"]: r for r in csv.DictReader(io.StringIO(as_csv.render([s])))}
    assert float(rows["request"]["errs"]) == 0.25 and float(rows["request/io"]["errs"]) == 0.5
    assert float(rows["request"]["split_own_ns"]) == 16 * MS and float(rows["request"]["split_kids_ns"]) == 104 * MS
    assert float(rows["request"]["spread_ns"]) == 15 * MS and float(rows["request"]["spread_ns_error"]) == 10 * MS
    js = {tuple(r["path"]): r for r in json.loads(as_json.render([s]))}
    assert js[("request",)]["errs"] == 0.25 and js[("request",)]["split_ns"] == {"own": 16 * MS, "kids": 104 * MS}
    assert js[("request",)]["spread_ns"] == {"value": 15 * MS, "error": 10 * MS}
    judged = json.loads(as_json.render([with_verdicts(s)]))[0]
    assert set(judged["verdict"]) >= {"verdict", "reason"}    # where the record has the key, the record's is kept


def test_a_new_metric_sorts_the_same_in_the_table_top_and_the_command_line(toys, tmp_path, capsys):
    s = toy_snapshot()
    by_table = [x.split()[0] for x in table.render([s], sort="errs", width=400).splitlines()[2:5]]
    assert by_table == ["request", "io", "model"]                        # 0.5 before 0.125
    by_top = [x.split()[0] for x in top.table_lines(s, 60.0, sort="errs", width=400)[1:4]]
    assert by_top == by_table
    s.save(tmp_path / "s.json")
    assert cli.main(["report", str(tmp_path / "s.json"), "--sort", "errs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [x.split()[0] for x in out[2:5]] == by_table


def test_every_sort_key_has_one_meaning(toys):
    """`cpu` is CPU time in the breakdown and in top alike (top's C/W is `cpu_per_wall`)."""
    s = snap(st("a", 10, 10 * MS, cpu_ns=10 * MS), st("a/x", 10, MS, cpu_ns=9 * MS), st("a/y", 10, 5 * MS, cpu_ns=10 * MS),
             st("a/z", 10, 2 * MS))
    for key in metrics.sort_keys():
        t = [x.split()[0] for x in table.render([s], sort=key, width=400).splitlines()[2:6]]
        assert [x.split()[0] for x in top.table_lines(s, 60.0, sort=key, width=400)[1:5]] == t, key
    assert [x.split()[0] for x in table.render([s], sort="cpu").splitlines()[3:6]] == ["y", "x", "z"]
    assert [x.split()[0] for x in table.render([s], sort="cpu_per_wall").splitlines()[3:6]] == ["x", "y", "z"]
    assert top.KEYS["u"] == "cpu_per_wall"


def test_a_new_metric_shows_in_top(toys):
    s = toy_snapshot()
    lines = top.table_lines(s, 60.0, width=400)
    assert "err/call" in lines[0] and "mean±half range ms" in lines[0]
    assert "0.25" in lines[1] and "15.00±10.00" in lines[1]
    assert "err/call" not in top.table_lines(s, 60.0, width=80)[0]        # the width decides what shows


def test_a_new_metric_shows_in_the_html_report(toys, chromium, tmp_path):
    page = html.render([toy_snapshot()])
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    assert [m["name"] for m in data["metrics"]][-3:] == ["errs", "split", "spread"]
    request = next(x for x in data["after"]["stages"] if x["path"] == ["request"])
    assert request["cells"]["errs"] == [0.25, "0.25"] and request["cells"]["spread"] == [15 * MS, "15.00±10.00"]
    (tmp_path / "r.html").write_text(page)
    dom = htmllib.unescape(browse(chromium, tmp_path / "r.html", tmp_path, "dom"))
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", dom)
    assert {"err/call", "own ms / kids ms", "mean±half range ms", "C/W", "%root"} <= set(heads)
    rows = {re.search(r'title="([^"]*)"', tr).group(1):   # the cells after the name, a bar's as its empty text
            [re.sub(r"<[^>]+>", "", c) for c in re.findall(r'<td(?! class="name")[^>]*>(.*?)</td>', tr)]
            for tr in re.findall(r"<tr>(.*?)</tr>", dom.split("<tbody>", 1)[1], re.S)}
    cells = dict(zip(heads[1:], rows["request"]))
    assert cells["err/call"] == "0.25" and cells["own ms / kids ms"] == "own 16.00 kids 104.0"
    assert cells["mean±half range ms"] == "15.00±10.00" and dict(zip(heads[1:], rows["request/model"]))["C/W"] == "~0.62"


def test_the_split_of_a_stages_own_time_adds_up_to_it():
    from dataclasses import replace
    s = replace(st("io", 10, 10 * MS, self_ns=8 * MS * 10, cpu_ns=2 * MS * 10), cpu_self=2 * MS * 10,
                runqueue={"total": 10 * MS, "self": 10 * MS, "var": 0.0, "var_self": 0.0, "reads": 10},
                covered_run=100 * MS, covered_run_self=70 * MS, suspended_total=30 * MS, suspended_self=10 * MS,
                loop_total=5 * MS, loop_self=5 * MS)
    split = metrics.METRICS["wall_split"].value(snap(s), s)
    # own time 80 ms: 20 on a CPU, 10 in the run queue, 70 - 20 - 10 = 40 blocked, 5 awaiting, 5 loop-ready
    assert split == pytest.approx({"on_cpu": 0.25, "runqueue": 0.125, "blocked": 0.5, "awaiting": 0.0625,
                                   "loop_ready": 0.0625})
    assert sum(split.values()) == pytest.approx(1.0)
    assert metrics.METRICS["wall_split"].value(snap(st("x", 1, MS)), st("x", 1, MS)) is None   # no CPU time read
    line = table.render([snap(s)], width=300).splitlines()[2]
    assert "on_cpu 25.0 runqueue 12.5 blocked 50.0 awaiting 6.2 loop_ready 6.2" in line
