"""A stage named "a/b" and a stage "b" nested in "a" never print alike, and names print as written: the table
and HTML show nesting by indentation; a path printed for people quotes a name holding a '/' (path_shown); a
path that keys (CSV `path`, the Prometheus and OTel `path` label, `snap[...]`) escapes it with '\\' and parses
back to the path it names (path_text)."""
import csv
import html as htmllib
import io
import json
import re
import time

import pytest

import instrument
from instrument.analysis.advice import advise
from instrument.analysis.diff import diff
from instrument.exporters import ADVICE, DIFF, chrome, hatchet, html, table
from instrument.exporters import csv as as_csv, json as as_json, markdown as as_markdown
from instrument.snapshot import parse_path, path_shown, path_text
from browser import browse, chromium  # noqa: F401  (the page read back by a real browser)

SHAPES = {("a/b",): "a\\/b", ("a", "b"): "a/b", ("a",): "a", ("c\\",): "c\\\\", ("c\\", "d"): "c\\\\/d",
          ("c\\/d",): "c\\\\\\/d"}
SHOWN = {("a/b",): '"a/b"', ("a", "b"): "a/b", ("a",): "a", ("c\\",): "c\\", ("c\\", "d"): "c\\/d",
         ("c\\/d",): '"c\\/d"', ('"q"', "x/y"): '"""q"""/"x/y"', ('q"', "d"): 'q"/d'}
NAMES = ["a/b", "a", "b", "c\\", "d", "c\\/d"]   # the table's rows: names as written, nesting by indent


def record(rounds=3):
    # each innermost stage sleeps 1 ms: every stage has a width in the icicle (one under 1 px is not drawn)
    for _ in range(rounds):
        with instrument.stage("a/b"):
            time.sleep(0.001)
        with instrument.stage("a"):
            with instrument.stage("b"):
                time.sleep(0.001)
        with instrument.stage("c\\"):
            with instrument.stage("d"):
                time.sleep(0.001)
        with instrument.stage("c\\/d"):
            time.sleep(0.001)
    return instrument.snapshot()


@pytest.fixture
def shapes(backend):
    instrument.configure(trace_events=1000)
    return record()


def test_path_text_is_one_to_one():
    for path, text in SHAPES.items():
        assert path_text(path) == text and parse_path(text) == path
    assert len(set(SHAPES.values())) == len(SHAPES)


def test_path_shown_keeps_names_as_written_and_paths_apart():
    for path, text in SHOWN.items():
        assert path_shown(path) == text
    assert len(set(SHOWN.values())) == len(SHOWN)
    assert path_shown(("POST /classify", "tokenize")) == '"POST /classify"/tokenize'


def test_snapshot_holds_both_shapes_and_finds_each_by_its_text(shapes):
    assert {s.path for s in shapes} == set(SHAPES)
    for path, text in SHAPES.items():
        assert shapes[text].path == path and shapes[path].calls == 3


def test_table_csv_json_markdown(shapes):
    text = table.render([shapes], width=120)
    rows = [l.split()[0] for l in text.splitlines()[2:8]]
    assert rows == NAMES
    got = {(r["path"], r["stage"]) for r in csv.DictReader(io.StringIO(as_csv.render([shapes])))}
    assert got == {(t, p[-1]) for p, t in SHAPES.items()} and {parse_path(p) for p, _ in got} == set(SHAPES)
    assert {tuple(r["path"]) for r in json.loads(as_json.render([shapes]))} == set(SHAPES)
    markdown_it = pytest.importorskip("markdown_it")
    page = markdown_it.MarkdownIt("commonmark").enable("table").render(as_markdown.render([shapes]))
    cells = [htmllib.unescape(c).replace("\xa0", "") for c in re.findall(r"<td>([^<]*)</td>", page)]
    assert set(NAMES) <= set(cells)   # what a markdown reader shows


def test_diff_and_advice(shapes):
    d = diff(shapes, shapes)
    labels = {l.split()[0] for l in DIFF.render(d).splitlines()[3:] if l and not l.startswith(" ")}
    assert {path_shown(p) for p in SHAPES} <= labels
    got = [r["path"] for r in csv.DictReader(io.StringIO(DIFF.render(d, "csv")))]
    assert sorted(got) == sorted(SHAPES.values())
    assert {tuple(r["path"]) for r in json.loads(DIFF.render(d, "json"))["rows"]} == set(SHAPES)
    assert '| "a/b"' in DIFF.render(d, "markdown")
    for path, text in SHAPES.items():
        assert d.row(text).path == path
    advice = advise(shapes, top=10)
    lines = [l for l in ADVICE.render(advice).splitlines() if re.match(r"\d+\. ", l)]
    shown = {re.match(r"\d+\. (.*): \S+ — ", l).group(1) for l in lines}
    assert shown == {path_shown(a["path"]) for a in advice} and len(shown) == len(advice)


def test_prometheus_labels(shapes):
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    from instrument.exporters import prometheus
    labels = set()
    for fam in text_string_to_metric_families(prometheus.render([shapes])):
        if fam.name == "instrument_stage_duration_seconds":
            labels |= {(s.labels["stage"], s.labels["path"]) for s in fam.samples}
    assert labels == {(p[-1], t) for p, t in SHAPES.items()}
    assert 'stage="a/b"' in prometheus.render([shapes])   # the name as written in the exposition


def test_chrome_trace(shapes):
    events = [e for e in json.loads(chrome.render([shapes]))["traceEvents"] if e.get("ph") == "X"]
    assert {(e["name"], e["args"]["path"]) for e in events} == {(p[-1], t) for p, t in SHAPES.items()}


def test_hatchet_tree(shapes):
    tree = hatchet.to_literal(shapes)
    seen = set()

    def walk(node, up):
        path = up + (node["frame"]["name"],)
        seen.add(path)
        for k in node.get("children", ()):
            walk(k, path)
    for root in tree:
        walk(root, ())
    assert seen == set(SHAPES)     # the tree keeps the shapes apart, names as they are


def test_otel_attributes(shapes):
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from instrument.serve import otel
    reader = InMemoryMetricReader()
    otel.OTelBridge(MeterProvider(metric_readers=[reader]).get_meter("t")).record(shapes)
    got = set()
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                got |= {(p.attributes["stage"], p.attributes["path"]) for p in m.data.data_points}
    assert got == {(p[-1], t) for p, t in SHAPES.items()}


def test_html_page(shapes, tmp_path, chromium):
    page = tmp_path / "paths.html"
    page.write_text(html.render([shapes, shapes], diff=True))
    dom = browse(chromium, page, tmp_path, "dom")
    assert 'data-rendered="1"' in dom
    cells = {htmllib.unescape(c) for c in re.findall(r'data-path="([^"]*)"', dom.split('id="icicle"', 1)[1]
                                                    .split('id="icicle-before"', 1)[0])}
    assert cells == {path_shown(p) for p in SHAPES}
    names = {htmllib.unescape(t) for t in re.findall(r'<td class="name"[^>]*title="([^"]*)"', dom)}
    assert names == {path_shown(p) for p in SHAPES}
    cells = re.findall(r'<td class="name" title[^>]*>(?:<span[^>]*></span>)?([^<]*)<', dom)
    shown = {htmllib.unescape(t).strip() for t in cells}
    assert set(NAMES) <= shown   # the tree's names as written
