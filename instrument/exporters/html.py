"""One self-contained HTML report: an icicle chart of the stage tree sized by
total wall time (hover for the numbers, click to zoom), the breakdown table
under it, and with `before=` a comparison of two snapshots.

No network, no CDN: CSS, script and data are inline.  The data is embedded as
JSON in a non-executed script element with `<`, `>`, `&` and U+2028/9
escaped, and every stage name reaches the page through textContent, so a name
like `<script>...</script>` is shown as text and never runs.
"""
from __future__ import annotations

import html
import json
import time
from typing import Any, Dict, Optional

from ..snapshot import Snapshot, StageStats

_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def embed_json(data: Any) -> str:
    """JSON that cannot end its <script> element or open a comment."""
    s = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return "".join(_ESCAPES.get(c, c) for c in s)


def _stage(snap: Snapshot, s: StageStats) -> Dict[str, Any]:
    return {"path": list(s.path), "calls": s.calls, "errors": s.errors, "total": s.wall_total, "self": s.wall_self,
            "mean": s.wall_mean, "p50": s.quantile(0.5), "p99": s.quantile(0.99), "cpu": s.cpu_total,
            "ratio": s.cpu_ratio, "root": snap.share_of_root(s), "parent": snap.share_of_parent(s),
            "gpu": (s.gpu or {}).get("total_ns")}


def _side(snap: Snapshot, label: str) -> Dict[str, Any]:
    m = snap.meta
    procs = list({(p.get("pid"), p.get("host")): p for p in (m.get("merged_from") or [m])}.values())
    span = None   # merged: the wall span of the sources, not the last one's duration
    if m.get("merged_from") and m.get("start_time") is not None and m.get("end_time") is not None:
        span = int((m["end_time"] - m["start_time"]) * 1e9)
    return {"label": label, "stages": [_stage(snap, s) for s in snap], "total": snap.total_ns,
            "processes": len(procs), "pids": [p.get("pid") for p in procs][:50], "host": m.get("host"),
            "argv": m.get("argv"), "start": m.get("start_time"), "end": m.get("end_time"),
            "duration": span if span is not None else m.get("duration_ns")}


def render(snap: Snapshot, before: Optional[Snapshot] = None, title: Optional[str] = None) -> str:
    """The report as one HTML document; with `before`, `snap` is compared against it."""
    if title is None:
        title = "instrument: before / after" if before is not None else "instrument: stage breakdown"
    data: Dict[str, Any] = {"after": _side(snap, "after" if before is not None else "snapshot"),
                            "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    if before is not None:
        from ..diff import diff
        data["before"] = _side(before, "before")
        data["headline"] = diff(before, snap).headline
    return (_TEMPLATE.replace("%%TITLE%%", html.escape(title))
            .replace("%%CSS%%", _CSS).replace("%%JS%%", _JS).replace("%%DATA%%", embed_json(data)))


def write(path: str, snap: Snapshot, before: Optional[Snapshot] = None, title: Optional[str] = None) -> None:
    text = render(snap, before, title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>%%TITLE%%</title>
<style>%%CSS%%</style>
</head>
<body>
<header>
  <h1>%%TITLE%%</h1>
  <div id="headline" class="headline"></div>
  <div id="summary" class="chips"></div>
</header>
<main>
  <section class="card">
    <div class="card-head"><h2 id="chart-title">Where the time goes</h2>
      <span class="hint">width = total wall time &middot; hover for numbers &middot; click to zoom, click the top bar to zoom out</span></div>
    <div id="icicle" class="icicle" role="img" aria-label="icicle chart of the stage tree"></div>
    <div id="before-wrap" hidden><h3 class="sub">before (same scale)</h3><div id="icicle-before" class="icicle"></div></div>
    <div id="legend" class="legend"></div>
  </section>
  <section class="card">
    <div class="card-head"><h2>Stages</h2><span class="hint">click a column to sort; ms unless noted</span></div>
    <div class="table-wrap"><table id="table"></table></div>
  </section>
</main>
<div id="tooltip" class="tooltip" hidden></div>
<footer id="footer"></footer>
<script type="application/json" id="data">%%DATA%%</script>
<script>%%JS%%</script>
</body>
</html>
"""

_CSS = r"""
:root { --bg:#f6f7fb; --card:#fff; --ink:#1d2433; --muted:#667085; --line:#e4e7ee; --accent:#3b5bdb;
  --good:#2f9e44; --bad:#e03131; --font: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  --mono: ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, Consolas, monospace; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink); font:14px/1.45 var(--font); }
header { padding:22px 32px 10px; }
h1 { margin:0 0 6px; font-size:21px; font-weight:650; letter-spacing:-0.01em; }
h2 { margin:0; font-size:15px; font-weight:600; }
h3.sub { margin:14px 0 6px; font-size:12px; font-weight:600; color:var(--muted); text-transform:uppercase; letter-spacing:.04em; }
.headline { font-size:16px; font-weight:600; margin:4px 0 8px; }
.headline.faster { color:var(--good); } .headline.slower { color:var(--bad); }
.chips { display:flex; flex-wrap:wrap; gap:8px; }
.chip { background:var(--card); border:1px solid var(--line); border-radius:999px; padding:3px 11px; font-size:12.5px; color:var(--muted); }
.chip b { color:var(--ink); font-weight:600; }
main { padding:8px 32px 24px; display:flex; flex-direction:column; gap:18px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:12px; padding:16px 18px 18px;
  box-shadow:0 1px 2px rgba(16,24,40,.04); }
.card-head { display:flex; align-items:baseline; justify-content:space-between; gap:16px; margin-bottom:12px; }
.hint { color:var(--muted); font-size:12px; }
.icicle { position:relative; width:100%; overflow:hidden; border-radius:6px; background:#fafbfd; }
.cell { position:absolute; height:26px; border-radius:3px; border:1px solid rgba(255,255,255,.9);
  overflow:hidden; white-space:nowrap; text-overflow:ellipsis; padding:4px 6px; font-size:12px; color:#0b1220;
  cursor:pointer; transition: filter .1s; }
.cell:hover { filter:brightness(.92) saturate(1.2); outline:2px solid rgba(29,36,51,.55); z-index:2; }
.cell.zoom-parent { opacity:.75; }
.legend { margin-top:10px; display:flex; gap:14px; flex-wrap:wrap; color:var(--muted); font-size:12px; }
.legend .sw { display:inline-block; width:12px; height:12px; border-radius:3px; vertical-align:-2px; margin-right:5px; }
.table-wrap { overflow-x:auto; }
table { border-collapse:collapse; width:100%; font-size:13px; }
th, td { padding:6px 10px; border-bottom:1px solid var(--line); text-align:right; white-space:nowrap; }
th { position:sticky; top:0; background:#f9fafc; color:var(--muted); font-weight:600; font-size:12px; cursor:pointer; user-select:none; }
th:first-child, td:first-child { text-align:left; }
td { font-variant-numeric: tabular-nums; }
tr:hover td { background:#f4f6fb; }
td.name { font-family:var(--mono); font-size:12.5px; max-width:420px; overflow:hidden; text-overflow:ellipsis; }
td .bar { display:inline-block; height:6px; border-radius:3px; background:var(--accent); opacity:.55; margin-right:8px; vertical-align:1px; }
.up { color:var(--bad); } .down { color:var(--good); } .na { color:#98a2b3; }
.tag { font-size:11px; color:var(--muted); border:1px solid var(--line); border-radius:4px; padding:0 4px; margin-left:6px; font-family:var(--font); }
.tooltip { position:fixed; z-index:10; pointer-events:none; background:#111827; color:#f9fafb; border-radius:8px;
  padding:10px 12px; font-size:12.5px; box-shadow:0 8px 24px rgba(0,0,0,.25); max-width:420px; }
.tooltip .t { font-family:var(--mono); font-weight:600; margin-bottom:6px; word-break:break-all; }
.tooltip table { font-size:12px; width:auto; } .tooltip td { border:0; padding:1px 10px 1px 0; color:#e5e7eb; }
.tooltip td:first-child { color:#9ca3af; }
footer { padding:0 32px 28px; color:var(--muted); font-size:12px; }
"""

_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("data").textContent);
  var A = D.after, B = D.before || null;
  var PALETTE = ["#4c6ef5", "#12b886", "#fab005", "#f76707", "#7950f2", "#15aabf", "#e64980", "#82c91e", "#fd7e14", "#228be6"];
  function el(tag, cls, text) { var e = document.createElement(tag); if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text); return e; }
  function key(p) { return JSON.stringify(p); }
  function ms(ns) { if (ns === null || ns === undefined) return "n/a"; var v = ns / 1e6;
    return v >= 10000 ? v.toFixed(0) : v >= 100 ? v.toFixed(1) : v >= 1 ? v.toFixed(2) : v >= 0.01 ? v.toFixed(3) : v.toFixed(4); }
  function human(ns) { if (ns === null || ns === undefined) return "n/a";
    var u = [["s", 1e9], ["ms", 1e6], ["\u00b5s", 1e3], ["ns", 1]], i = 0;
    while (i < 3 && Math.abs(ns) < u[i][1]) i++;
    var v = ns / u[i][1], d = v ? Math.max(0, 2 - Math.floor(Math.log10(Math.abs(v)))) : 0;
    return v.toFixed(d) + " " + u[i][0]; }
  function pct(x) { return x === null || x === undefined ? "n/a" : (100 * x).toFixed(1) + "%"; }
  function change(b, a) { if (b === null || b === undefined || a === null || a === undefined || !b) return null; return a / b - 1; }
  function signed(c) { if (c === null) return "n/a"; var x = 100 * c;
    return (x > 0.05 ? "+" : x < -0.05 ? "\u2212" : "\u00b1") + Math.abs(x).toFixed(1) + "%"; }

  function index(side) { var m = {}; side.stages.forEach(function (s) { m[key(s.path)] = s; }); return m; }
  var AI = index(A), BI = B ? index(B) : {};

  function tree(side) {
    var nodes = {}, roots = [];
    side.stages.forEach(function (s) { nodes[key(s.path)] = { s: s, kids: [] }; });
    side.stages.forEach(function (s) {
      var n = nodes[key(s.path)];
      if (s.path.length === 1) roots.push(n); else { var p = nodes[key(s.path.slice(0, -1))]; if (p) p.kids.push(n); else roots.push(n); }
    });
    return roots;
  }

  // ----- header
  (function header() {
    var h = document.getElementById("headline");
    if (D.headline) {
      h.textContent = D.headline;
      var m = D.headline.match(/\(([+\u2212\u00b1])/);
      if (m) h.className = "headline " + (m[1] === "+" ? "slower" : m[1] === "\u2212" ? "faster" : "");
    } else h.remove();
    var chips = document.getElementById("summary");
    function chip(label, value) { var c = el("span", "chip"); c.appendChild(document.createTextNode(label + " "));
      c.appendChild(el("b", null, value)); chips.appendChild(c); }
    chip("top-level total", human(A.total));
    chip("stages", A.stages.length);
    chip(A.processes === 1 ? "process" : "processes", A.processes === 1 ? (A.pids[0] === null ? "1" : "pid " + A.pids[0]) : A.processes);
    if (A.host) chip("host", A.host);
    if (A.duration) chip("recorded for", human(A.duration));
    if (A.argv && A.argv.length) chip("argv", A.argv.join(" ").slice(0, 80));
    if (B) { chip("before: total", human(B.total)); chip("before: stages", B.stages.length); }
    document.getElementById("footer").textContent = "instrument report \u00b7 generated " + D.generated +
      (A.start ? " \u00b7 recording started " + new Date(A.start * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "");
  })();

  // ----- colours
  function rootColour(name) { var h = 0; for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0; return PALETTE[h % PALETTE.length]; }
  function shade(hex, depth) { var n = parseInt(hex.slice(1), 16), r = n >> 16, g = (n >> 8) & 255, b = n & 255, t = Math.min(0.62, 0.18 + depth * 0.13);
    function mix(c) { return Math.round(c + (255 - c) * t); } return "rgb(" + mix(r) + "," + mix(g) + "," + mix(b) + ")"; }
  function diffColour(c) { if (c === null) return "#c5cbd6"; var x = Math.max(-1, Math.min(1, c / 0.5)), t = Math.abs(x);
    if (t < 0.04) return "#e6eaf2";   // within 2 %: no colour, so real changes stand out
    var base = x > 0 ? [224, 49, 49] : [47, 158, 68], w = 0.82 - 0.62 * t;
    return "rgb(" + base.map(function (v) { return Math.round(v + (255 - v) * w); }).join(",") + ")"; }

  // ----- tooltip
  var tip = document.getElementById("tooltip");
  function showTip(ev, s, side) {
    while (tip.firstChild) tip.removeChild(tip.firstChild);
    tip.appendChild(el("div", "t", s.path.join(" / ")));
    var t = el("table"), other = B ? (side === A ? BI : AI)[key(s.path)] : null;
    var rows = [["calls", s.calls + (s.errors ? " (" + s.errors + " errors)" : "")], ["total", human(s.total)], ["self", human(s.self)],
      ["mean", human(s.mean)], ["p50", human(s.p50)], ["p99", human(s.p99)],
      ["CPU", human(s.cpu) + (s.ratio === null ? "" : " (CPU/wall " + s.ratio.toFixed(2) + ")")],
      ["share of parent", pct(s.parent)], ["share of root", pct(s.root)]];
    if (s.gpu !== null && s.gpu !== undefined) rows.push(["GPU", human(s.gpu)]);
    if (B) {
      var b = side === A ? other : s, a = side === A ? s : other;
      rows.push(["before \u2192 after", b && a ? human(b.mean) + " \u2192 " + human(a.mean) + " per call (" + signed(change(b.mean, a.mean)) + ")"
        : (b ? "only before" : "only after")]);
      if (b && a) rows.push(["total", human(b.total) + " \u2192 " + human(a.total) + " (" + signed(change(b.total, a.total)) + ")"]);
    }
    rows.forEach(function (r) { var tr = el("tr"); tr.appendChild(el("td", null, r[0])); tr.appendChild(el("td", null, r[1])); t.appendChild(tr); });
    tip.appendChild(t);
    tip.hidden = false; moveTip(ev);
  }
  function moveTip(ev) { var w = tip.offsetWidth, h = tip.offsetHeight, x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > window.innerWidth - 8) x = ev.clientX - w - 14; if (y + h > window.innerHeight - 8) y = ev.clientY - h - 14;
    tip.style.left = Math.max(4, x) + "px"; tip.style.top = Math.max(4, y) + "px"; }
  function hideTip() { tip.hidden = true; }

  // ----- icicle
  var ROW = 28, zoom = null;
  function draw(box, side, scaleTotal, colourOf) {
    while (box.firstChild) box.removeChild(box.firstChild);
    var roots = tree(side), W = box.clientWidth || 1200, maxDepth = 0;
    var focus = null;
    if (zoom) { (function find(ns) { ns.forEach(function (n) { if (key(n.s.path) === zoom) focus = n; else find(n.kids); }); })(roots); }
    var top = focus ? [focus] : roots, base = focus ? focus.s.total : scaleTotal, d0 = focus ? focus.s.path.length - 1 : 0;
    if (focus) {   // the ancestors, full width, to click back out
      for (var i = 1; i < focus.s.path.length; i++) {
        var anc = (side === A ? AI : BI)[key(focus.s.path.slice(0, i))];
        if (anc) place(anc, 0, W, i - 1, true);
      }
    }
    function place(s, x, w, depth, isParent) {
      var c = el("div", "cell" + (isParent ? " zoom-parent" : ""));
      c.style.left = x + "px"; c.style.width = Math.max(w - 1, 1) + "px"; c.style.top = (depth * ROW) + "px";
      c.style.background = colourOf(s);
      c.setAttribute("data-path", s.path.join("/"));
      if (w > 34) c.textContent = s.path[s.path.length - 1] + (w > 120 ? "  " + ms(s.total) + " ms" : "");
      c.addEventListener("mousemove", function (ev) { showTip(ev, s, side); });
      c.addEventListener("mouseleave", hideTip);
      c.addEventListener("click", function () {   // zoom in; the zoomed bar or an ancestor bar zooms back out
        var k = key(s.path), up = s.path.length > 1 ? key(s.path.slice(0, -1)) : null;
        zoom = isParent ? (s.path.length > 1 ? k : null) : zoom === k ? up : k;
        hideTip(); redraw(); });
      box.appendChild(c); maxDepth = Math.max(maxDepth, depth);
    }
    function lay(nodes, x, w, total, depth) {
      var cx = x;
      nodes.forEach(function (n) {
        var nw = total > 0 ? w * n.s.total / total : 0;
        if (nw >= 1) { place(n.s, cx, nw, depth, false); lay(n.kids, cx, nw, n.s.total, depth + 1); }
        cx += nw;
      });
    }
    lay(top, 0, W, base, focus ? d0 : 0);
    box.style.height = ((maxDepth + 1) * ROW + 2) + "px";
    if (!side.stages.length) { box.appendChild(el("div", "hint", "no stages recorded")); box.style.height = "40px"; }
  }
  function colourAfter(s) { return B ? diffColour(BI[key(s.path)] ? change(BI[key(s.path)].mean, s.mean) : null) : shade(rootColour(s.path[0]), s.path.length - 1); }
  function colourBefore(s) { return diffColour(AI[key(s.path)] ? change(s.mean, AI[key(s.path)].mean) : null); }
  function redraw() {
    var scale = B ? Math.max(A.total, B.total) : A.total;
    draw(document.getElementById("icicle"), A, scale, colourAfter);
    if (B) { document.getElementById("before-wrap").hidden = false; draw(document.getElementById("icicle-before"), B, scale, colourBefore); }
  }
  if (B) {
    document.getElementById("chart-title").textContent = "After, coloured by change of mean per call";
    var lg = document.getElementById("legend");
    [["faster", diffColour(-0.5)], ["slower", diffColour(0.5)], ["about the same", diffColour(0)], ["on one side only", diffColour(null)]].forEach(function (x) {
      var s = el("span"); var sw = el("span", "sw"); sw.style.background = x[1]; s.appendChild(sw); s.appendChild(document.createTextNode(x[0])); lg.appendChild(s); });
  }
  redraw();
  window.addEventListener("resize", redraw);

  // ----- table
  var cols = [
    ["stage", function (s) { return s.path.join("/"); }],
    ["calls", function (s) { return s.calls; }, String],
    ["total ms", function (s) { return s.total; }, ms],
    ["% root", function (s) { return s.root; }, pct],
    ["mean", function (s) { return s.mean; }, ms],
    ["p50", function (s) { return s.p50; }, ms],
    ["p99", function (s) { return s.p99; }, ms],
    ["self ms", function (s) { return s.self; }, ms],
    ["CPU ms", function (s) { return s.cpu; }, ms],
    ["CPU/wall", function (s) { return s.ratio; }, function (v) { return v === null ? "n/a" : v.toFixed(2); }]
  ];
  if (B) {
    cols = cols.filter(function (c) { return ["p50", "CPU/wall", "% root", "self ms"].indexOf(c[0]) < 0; });   // room for the comparison
    cols.splice(3, 0, ["before ms", function (s) { var b = BI[key(s.path)]; return b ? b.total : null; }, ms],
      ["\u0394 total", function (s) { var b = BI[key(s.path)]; return b ? change(b.total, s.total) : null; }, signed, true]);
    cols.splice(6, 0, ["before mean", function (s) { var b = BI[key(s.path)]; return b ? b.mean : null; }, ms],
      ["\u0394 mean", function (s) { var b = BI[key(s.path)]; return b ? change(b.mean, s.mean) : null; }, signed, true]);
  }
  var rows = A.stages.slice();
  if (B) B.stages.forEach(function (s) { if (!AI[key(s.path)]) rows.push(Object.assign({ onlyBefore: true }, s)); });
  var sortCol = null, sortDesc = true;
  function renderTable() {
    var t = document.getElementById("table"); while (t.firstChild) t.removeChild(t.firstChild);
    var thead = el("thead"), hr = el("tr");
    cols.forEach(function (c, i) { var th = el("th", null, c[0] + (sortCol === i ? (sortDesc ? " \u25be" : " \u25b4") : ""));
      th.addEventListener("click", function () { if (sortCol === i) { if (!sortDesc) sortCol = null; sortDesc = !sortDesc; } else { sortCol = i; sortDesc = i !== 0; } renderTable(); });
      hr.appendChild(th); });
    thead.appendChild(hr); t.appendChild(thead);
    var list = rows.slice();
    if (sortCol !== null) { var f = cols[sortCol][1];
      list.sort(function (x, y) { var a = f(x), b = f(y); if (a === null) return 1; if (b === null) return -1; var r = a < b ? -1 : a > b ? 1 : 0; return sortDesc ? -r : r; }); }
    var tb = el("tbody"), maxTotal = Math.max.apply(null, rows.map(function (s) { return s.total; }).concat([1]));
    list.forEach(function (s) {
      var tr = el("tr"), name = el("td", "name");
      name.style.paddingLeft = (10 + (sortCol === null ? 16 * (s.path.length - 1) : 0)) + "px";
      var bar = el("span", "bar"); bar.style.width = Math.max(2, 60 * s.total / maxTotal) + "px"; name.appendChild(bar);
      name.appendChild(document.createTextNode(sortCol === null ? s.path[s.path.length - 1] : s.path.join("/")));
      name.title = s.path.join("/");
      if (s.onlyBefore) name.appendChild(el("span", "tag", "only before"));
      else if (B && !BI[key(s.path)]) name.appendChild(el("span", "tag", "only after"));
      tr.appendChild(name);
      cols.slice(1).forEach(function (c) {
        var v = s.onlyBefore && c[0].indexOf("before") < 0 && c[0].indexOf("\u0394") < 0 ? null : c[1](s);
        if (s.onlyBefore && c[0] === "before ms") v = s.total;
        if (s.onlyBefore && c[0] === "before mean") v = s.mean;
        var td = el("td", null, v === null || v === undefined ? "n/a" : c[2](v));
        if (v === null || v === undefined) td.className = "na";
        else if (c[3]) td.className = v > 0.005 ? "up" : v < -0.005 ? "down" : "";
        tr.appendChild(td);
      });
      tr.addEventListener("mousemove", function (ev) { showTip(ev, s, s.onlyBefore ? B : A); });
      tr.addEventListener("mouseleave", hideTip);
      tb.appendChild(tr);
    });
    t.appendChild(tb);
  }
  renderTable();
  document.documentElement.setAttribute("data-rendered", "1");
})();
"""
