"""Each format names the unit of the values under its headers, and the values are
in that unit: read back from the output and compared with the snapshot."""
import csv
import html as htmllib
import io
import json
import re

import pytest

from instrument.analysis.diff import diff
from instrument.exporters import DIFF, chrome, hatchet, html, table
from instrument.exporters import csv as as_csv, json as as_json, markdown as as_markdown
from snapfactory import snap, st
from browser import browse, chromium  # noqa: F401

MS = 1_000_000
CTR = {"cache-references": {"total": 4000}, "cache-misses": {"total": 500}, "branches": {"total": 10_000},
       "branch-misses": {"total": 250}, "page-faults": {"total": 12}, "context-switches": {"total": 3}}


def sample():
    return snap(st("request", 100, 25 * MS, self_ns=400 * MS, cpu_ns=2000 * MS, counters=CTR),
                st("request/model", 100, 21 * MS, cpu_ns=1500 * MS))


def test_breakdown_csv_fields_name_their_units():
    s = sample()
    rows = {r["path"]: r for r in csv.DictReader(io.StringIO(as_csv.render([s])))}
    req, model = rows["request"], rows["request/model"]
    assert float(req["total_ns"]) == 2500 * MS and float(req["mean_ns"]) == 25 * MS
    assert float(req["self_ns"]) == 400 * MS and float(req["cpu_ns"]) == 2000 * MS
    assert float(req["p50_ns"]) == pytest.approx(25 * MS, rel=0.008)
    assert float(req["root_pct"]) == 100.0 and float(model["root_pct"]) == pytest.approx(84.0)   # percent
    assert float(req["cpu_per_wall"]) == pytest.approx(0.8)                                    # a ratio
    assert float(req["cache_miss_pct"]) == pytest.approx(12.5) and float(req["branch_miss_pct"]) == pytest.approx(2.5)
    assert float(req["page_faults"]) == 12 and float(req["context_switches"]) == 3               # counts
    assert float(req["page_faults_per_call"]) == pytest.approx(0.12)                             # per call
    for field in next(csv.reader(io.StringIO(as_csv.render([s])))):
        assert field in ("path", "stage", "calls", "cpu_per_wall", "ipc", "mpki", "page_faults", "context_switches",
                         "verdict") or field.endswith(("_ns", "_pct", "_per_call")), field


def test_breakdown_table_markdown_json_units():
    s = sample()
    text = table.render([s], width=160).splitlines()
    head = text[0]
    for h in ("total ms", "mean ms", "p50 ms", "p99 ms", "self ms", "CPU ms", "%root", "miss%", "brmiss%"):
        assert h in head
    row = text[2].split()
    assert row[:4] == ["request", "100", "2500.0", "100.0"] and row[4] == "25.00"   # ms and percent
    md = as_markdown.render([s]).splitlines()
    assert "| total ms | %root | mean ms | p50 ms | p99 ms |" in md[0]
    assert "| 2500.0 | 100.0 | 25.00 |" in md[2]
    j = {tuple(r["path"]): r for r in json.loads(as_json.render([s]))}
    assert j[("request",)]["wall_ns"]["total"] == 2500 * MS and j[("request", "model")]["root_pct"] == 84.0


def test_diff_csv_and_json_units():
    b = sample()
    a = snap(st("request", 100, 20 * MS, cpu_ns=1600 * MS), st("request/model", 100, 16 * MS))
    d = diff(b, a)
    rows = {r["path"]: r for r in csv.DictReader(io.StringIO(DIFF.render(d, "csv")))}
    req = rows["request"]
    assert float(req["total_before_ns"]) == 2500 * MS and float(req["total_after_ns"]) == 2000 * MS
    assert float(req["mean_delta_ns"]) == -5 * MS and float(req["mean_ratio"]) == pytest.approx(0.8)
    assert req["calls_before"] == "100"
    j = json.loads(DIFF.render(d, "json"))
    row = next(r for r in j["rows"] if r["path"] == ["request"])
    assert row["mean_ns"]["before"] == 25 * MS and row["p99_ns"]["after"] == pytest.approx(20 * MS, rel=0.008)
    assert float(req["estimate_pct"]) == pytest.approx(100 * row["significance"]["estimate"])       # percent
    assert float(req["interval_low_pct"]) == pytest.approx(100 * row["interval"][0])
    assert -21 < float(req["estimate_pct"]) < -19


def test_machine_formats_in_seconds_and_microseconds():
    s = sample()
    lit = {n["frame"]["name"]: n for n in hatchet.to_literal(s)}
    assert lit["request"]["metrics"]["time (inc)"] == pytest.approx(2.5)          # seconds
    ev = snap(st("request", 1, 5 * MS), events=[{"path": ["request"], "tid": 1, "ts_ns": 2 * MS, "dur_ns": 5 * MS}])
    x = next(e for e in json.loads(chrome.render([ev]))["traceEvents"] if e["ph"] == "X")
    assert x["dur"] == 5000 and x["ts"] == 2000                                  # microseconds, as Chrome reads


def test_html_table_in_ms(chromium, tmp_path):
    page = tmp_path / "u.html"
    page.write_text(html.render([sample()]))
    dom = htmllib.unescape(browse(chromium, page, tmp_path, "dom"))
    head = re.findall(r"<th[^>]*>([^<]*)</th>", dom)
    assert head[:2] == ["stage", "verdict"]              # the verdict right after the name, to stay in view
    rest = [h for h in head[2:] if h != "split of own time %"]
    assert rest[:4] == ["calls", "total ms", "%root", "mean ms"]                # the breakdown table's headers
    assert {"miss%", "brmiss%", "faults"} <= set(head)                          # counter ratios
    body = dom.split("<tbody>", 1)[1]
    first = re.findall(r"<td[^>]*>([^<]*)</td>", body)[:5]
    assert first[1:5] == ["100", "2500.0", "100.0", "25.00"]   # the name cell and a split bar hold markup
    assert "12" in re.findall(r"<td[^>]*>([^<]*)</td>", body)
