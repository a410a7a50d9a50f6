import html as htmllib
import json
import re

import pytest

from instrument import cli
from instrument.exporters import html
from browser import browse, chromium, measure  # noqa: F401
from instrument.snapshot import SPLIT
from snapfactory import snap, st

MS = 1_000_000
EVIL = [
    "<script>alert(1)</script>",
    "</script><script>document.title='INJECTED'</script>",
    "<img src=x onerror=\"document.title='INJECTED'\">",
    "<!-- <script>document.title='INJECTED'</script>",
    "line\u2028sep\u2029x",
]


def report_snapshots():
    after = snap(st("request", 100, 25 * MS, self_ns=100 * MS, cpu_ns=2000 * MS), st("request/tokenize", 100, 3 * MS),
                 st("request/model", 100, 17 * MS), st("request/model/encoder", 100, 12 * MS),
                 st("request/postprocess", 100, 4 * MS), *(st(("request", e), 2, MS) for e in EVIL),
                 st("batch", 10, 50 * MS), st("batch/collate", 10, 20 * MS))
    before = snap(st("request", 100, 30 * MS), st("request/tokenize", 100, 3 * MS), st("request/model", 100, 23 * MS),
                  st("request/model/encoder", 100, 19 * MS), st("request/legacy", 100, 1 * MS))
    return before, after


def test_embedded_data_cannot_break_out():
    _, after = report_snapshots()
    page = html.render([after])
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1)
    assert "<" not in data and ">" not in data and "\u2028" not in data and "\u2029" not in data
    assert {tuple(s["path"]) for s in json.loads(data)["after"]["stages"]} == {s.path for s in after}
    assert page.count("<script") == 2 and "<!--" not in page
    assert "http://" not in page and "https://" not in page      # nothing fetched from anywhere


def test_page_in_headless_chromium(chromium, tmp_path):
    before, after = report_snapshots()
    page = tmp_path / "report.html"
    page.write_text(html.render([after]))
    dom = browse(chromium, page, tmp_path, "dom")
    assert 'data-rendered="1"' in dom                        # the script ran to the end
    assert re.search(r"<title>([^<]*)</title>", dom).group(1) == "instrument: stage breakdown"   # nothing injected ran
    icicle = re.search(r'<div id="icicle"[^>]*>(.*?)</div>\s*<div id="before-wrap"', dom, re.S).group(1)
    cells = re.findall(r'data-path="([^"]*)"', icicle)
    assert {"request", "request/model", "request/model/encoder", "batch", "batch/collate"} <= \
        {htmllib.unescape(c) for c in cells}
    text = htmllib.unescape(re.sub(r"<[^>]+>", " ", dom.split('<table id="table"', 1)[1]))
    for name in ("tokenize", "encoder", "collate", "<script>alert(1)</script>", EVIL[2]):   # names as written
        assert name in text
    assert "<script>alert(1)</script>" not in dom.split('<script type="application/json"')[0]   # escaped as text
    shot = tmp_path / "report.png"
    browse(chromium, page, tmp_path, str(shot))
    assert shot.stat().st_size > 10_000


def test_diff_page_in_headless_chromium(chromium, tmp_path):
    before, after = report_snapshots()
    before.save(tmp_path / "before.json")
    after.save(tmp_path / "after.json")
    page = tmp_path / "diff.html"
    assert cli.main(["export", "--html", str(page), str(tmp_path / "before.json"), str(tmp_path / "after.json"),
                     "--diff"]) == 0
    dom = browse(chromium, page, tmp_path, "dom")
    assert 'data-rendered="1"' in dom
    assert "request: 30.0 ms → 25.0 ms (−16.7%)" in htmllib.unescape(dom)
    assert 'id="before-wrap"' in dom and 'id="before-wrap" hidden' not in dom
    before_cells = re.findall(r'data-path="([^"]*)"', dom.split('id="icicle-before"', 1)[1])
    assert "request/legacy" in before_cells
    assert "only before" in dom and "only after" in dom


def test_diff_page_marks_noise(chromium, tmp_path):
    import numpy as np
    rng = np.random.default_rng(5)
    same = [int(v) for v in rng.normal(10 * MS, 1 * MS, 400)]
    again = [int(v) for v in rng.normal(10 * MS, 1 * MS, 400)]
    before = snap(st("request", 0, 0, values=same), st("request/model", 0, 0, values=same),
                  st("request/io", 0, 0, values=same))
    after = snap(st("request", 0, 0, values=again), st("request/model", 0, 0, values=again),
                 st("request/io", 0, 0, values=[2 * v for v in again]))
    page = tmp_path / "noise.html"
    page.write_text(html.render([before, after], diff=True))
    dom = htmllib.unescape(browse(chromium, page, tmp_path, "dom"))
    head = re.search(r'<div id="headline" class="headline (\w+)" data-significant="(\w+)">([^<]*)<', dom)
    assert head.group(1, 2) == ("noise", "false") and "within noise" in head.group(3)
    rows = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", dom.split("<tbody>", 1)[1], re.S):
        name = re.search(r'title="([^"]*)"', tr).group(1)
        rows[name] = re.findall(r"<td[^>]*>([^<]*)</td>", tr)
    head_cells = re.findall(r"<th[^>]*>([^<]*)</th>", dom)[1:]
    col = {h: k for k, h in enumerate(head_cells)}
    assert rows["request/io"][col["beyond noise?"]] == "slower"
    assert rows["request/model"][col["beyond noise?"]] == "~ within noise"
    assert rows["request/model"][col["\u0394 mean"]].startswith("~")
    assert not rows["request/io"][col["\u0394 mean"]].startswith("~")
    assert "within noise" in dom.split('id="legend"', 1)[1]


def test_tail_card_and_items_in_headless_chromium(chromium, tmp_path):
    """The tail view, the tail% column and per-item cost, as the browser renders them; names stay text."""
    from instrument.snapshot import Snapshot, path_shown
    evil = EVIL[0]
    base = snap(st("request", 0, 0, values=[2 * MS] * 99 + [12 * MS]), st(("request", evil), 100, MS // 5),
                st("request/forward", 100, 9 * MS // 5))
    stages = [s if s.path != ("request", "forward") else
              type(s)(**{**s.__dict__, "items": {"tokens": {"total": 36_000, "calls": 100}}}) for s in base]

    def call(seq, pre, fwd, slow):
        return {"path": ["request"], "wall_ns": pre + fwd, "start_ns": seq, "pid": 1, "tid": 1, "seq": seq,
                "slow": slow, "sample": not slow,
                "breakdown": [{"path": ["request", evil], "wall_ns": pre}, {"path": ["request", "forward"], "wall_ns": fwd}]}
    s = Snapshot(stages, base.meta, None, [call(k, MS // 5, 9 * MS // 5, False) for k in range(8)]
                 + [call(99, 10 * MS, 2 * MS, True)])
    page = tmp_path / "tail.html"
    page.write_text(html.render([s]))
    dom = browse(chromium, page, tmp_path, "dom")
    assert 'data-rendered="1"' in dom and 'id="tail-card" hidden' not in dom
    assert re.search(r"<title>([^<]*)</title>", dom).group(1) == "instrument: stage breakdown"
    tails = htmllib.unescape(re.sub(r"<[^>]+>", " ", dom.split('id="tails"', 1)[1].split("</section>", 1)[0]))
    assert path_shown(("request", evil)) in tails and "+9.80" in tails and "98.0%" in tails   # the name quoted
    assert "10.0 ms more" in tails
    stages_text = htmllib.unescape(re.sub(r"<[^>]+>", " ", dom.split('<table id="table"', 1)[1]))
    assert "tail%" in stages_text and "5.00 µs/token · 200k tokens/s" in stages_text


def test_system_share_and_estimates_shown_in_chromium(chromium, tmp_path):
    from dataclasses import replace
    alloc = replace(st("alloc", 40, 10 * MS, cpu_ns=400 * MS), cpu_sys_total=300 * MS, cpu_sys_self=300 * MS)
    tiny = replace(st("tiny", 1000, 2000, cpu_ns=1_900_000), cpu_read_calls=12, cpu_sys_total=0, cpu_sys_self=0)
    page = tmp_path / "r.html"
    text = html.render([snap(alloc, tiny)])
    page.write_text(text)
    dom = browse(chromium, page, tmp_path, "dom")
    assert re.search(r"<th[^>]*>sys%</th>", dom) and ">75.0<" in dom   # 300 of 400 ms in the kernel, as a column
    raw = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S).group(1)
    stages = [x for x in re.findall(r'\{"path":\["(\w+)"\][^{}]*?"estimated":(true|false)', raw)]
    assert dict(stages) == {"alloc": "false", "tiny": "true"}


LAYOUT = """
var t = document.getElementById("table"), wrap = t.parentElement;
function box(e) { var r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; }
function view() { var r = wrap.getBoundingClientRect(), x = r.left + wrap.clientLeft, y = r.top + wrap.clientTop;
  return {left: x, right: x + wrap.clientWidth, top: y, bottom: y + wrap.clientHeight}; }
var heads = Array.prototype.slice.call(t.querySelectorAll("th"));
var v = heads.findIndex(function (h) { return h.textContent === "verdict"; });
var rows = t.querySelectorAll("tbody tr"), last = rows[rows.length - 1];
function at() { return {view: view(), nameHead: box(heads[0]), verdictHead: box(heads[v]), name: box(last.children[0]),
  verdict: box(last.children[v]), verdictText: last.children[v].textContent}; }
var out = {wide: wrap.scrollWidth, client: wrap.clientWidth, tall: wrap.scrollHeight, clientH: wrap.clientHeight,
  start: at(), last: last.children[0].title, bars: {}};
wrap.scrollLeft = wrap.scrollWidth; wrap.scrollTop = wrap.scrollHeight;
out.scrolled = at(); out.scrollLeft = wrap.scrollLeft;
Array.prototype.forEach.call(rows, function (tr) { var bar = tr.querySelector(".split"); if (!bar) return;
  var w = bar.getBoundingClientRect().width, segs = {};
  bar.querySelectorAll(".seg").forEach(function (g) { segs[g.getAttribute("data-part")] = g.getBoundingClientRect().width / w; });
  out.bars[tr.children[0].title] = segs; });
out.legend = document.getElementById("table-legend").textContent;
rows[0].dispatchEvent(new MouseEvent("mousemove", {clientX: 100, clientY: 100, bubbles: true}));
out.tip = document.getElementById("tooltip").textContent;
return out;
"""


@pytest.mark.native_only   # the split bar's blocked part needs run-queue time: the C core's
def test_stage_and_verdict_stay_in_view_at_1400_px_with_the_split_bar(backend, chromium, tmp_path):
    """Measured in the browser at 1,400 px: a table wider and taller than its box keeps the stage name and the
    verdict in view at rest and scrolled to its far corner; each stage's bar is its own wall time by part; counters
    read in their units; the legend says what n/a and negative values mean."""
    import time
    import instrument
    instrument.configure(counters="task-clock,page-faults,context-switches,cpu-migrations,minor-faults,major-faults")
    for _ in range(3):
        with instrument.stage("request"):
            with instrument.stage("nap"):
                time.sleep(0.01)
            with instrument.stage("spin"):
                end = time.thread_time() + 0.005
                while time.thread_time() < end:
                    pass
            for k in range(40):
                with instrument.stage(f"step{k:02d}"):
                    instrument.add("tokens", k + 1)
    s = instrument.snapshot()
    got = measure(chromium, html.render([s]), tmp_path, LAYOUT, size=(1400, 900))
    assert got["wide"] > got["client"] + 100 and got["tall"] > got["clientH"] + 100   # it does scroll both ways
    view, start = got["start"]["view"], got["start"]
    assert view["left"] - 0.5 <= start["nameHead"]["left"] and start["verdictHead"]["right"] <= view["right"] + 0.5
    end = got["scrolled"]
    assert got["scrollLeft"] > 100
    assert view["left"] - 0.5 <= end["name"]["left"] and end["name"]["right"] <= end["verdict"]["left"] + 1
    assert end["verdict"]["right"] <= view["right"] + 0.5                      # name and verdict, side by side
    assert abs(end["verdictHead"]["top"] - view["top"]) <= 1                    # the header stays on top
    assert end["verdictHead"]["bottom"] - 1 <= end["verdict"]["top"] and end["verdict"]["bottom"] <= view["bottom"] + 1
    last = s[got["last"]]
    assert end["verdictText"] == last.verdict["verdict"]
    for name, segs in got["bars"].items():
        st_ = s[name]
        parts = {p: st_.split_part(p, True) for p in segs}
        whole = max(sum(st_.split_part(p, True) or 0 for p in SPLIT), st_.wall_self)
        for p, share in segs.items():
            assert share == pytest.approx(parts[p] / whole, abs=1.5 / 140), (name, p)
    nap = got["bars"]["request/nap"]
    assert max(nap, key=nap.get) == "blocked"              # a sleep is off the CPU by its own doing
    assert "n/a not measured" in got["legend"] and "negative" in got["legend"] and "run queue" in got["legend"]
    assert re.search(r"task-clock[\d.]+ (s|ms|µs)", got["tip"]), got["tip"]   # a clock in its unit, not raw ns


TIP = """
var rows = document.querySelectorAll("#table tbody tr"), tip = document.getElementById("tooltip"), out = [];
Array.prototype.forEach.call(rows, function (tr) {
  tr.dispatchEvent(new MouseEvent("mousemove", {clientX: 60, clientY: 60, bubbles: true}));
  var box = tip.getBoundingClientRect();
  Array.prototype.forEach.call(tip.querySelectorAll("td"), function (td) {
    var r = td.getBoundingClientRect();
    out.push({text: td.textContent, right: r.right, boxRight: box.right, left: r.left, boxLeft: box.left,
              fits: td.scrollWidth <= td.clientWidth + 1});
  });
});
return out;
"""


def test_tooltip_cells_are_never_clipped(chromium, tmp_path):
    """Every figure of the hover card lies inside the card, whole: a long verdict reason wraps instead of pushing
    the figures (`~0.00±0.01`) out of the card's box."""
    before, after = report_snapshots()
    cells = measure(chromium, html.render([after]), tmp_path, TIP, size=(900, 700))
    assert len(cells) > 20 and any(len(c["text"]) > 60 for c in cells)        # a long reason is among them
    for c in cells:
        assert c["boxLeft"] - 0.5 <= c["left"] and c["right"] <= c["boxRight"] + 0.5 and c["fits"], c
