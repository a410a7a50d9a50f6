(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("data").textContent);
  var A = D.after, B = D.before || null;
  // the parts of a stage's own wall time (StageStats.split_part), in the order they are stacked
  var PARTS = [["on_cpu", "on a CPU", "#2f9e44"], ["runqueue", "run queue: ready, waiting for a CPU", "#e8590c"],
    ["blocked", "blocked: off the CPU by its own doing (I/O, locks, sleep)", "#868e96"],
    ["gil", "GIL: waiting to take Python's global interpreter lock", "#e03131"],
    ["instrument", "instrument: its own reads at the child stages' boundaries", "#fcc419"],
    ["awaiting", "awaiting: its asyncio task suspended, not yet woken", "#4dabf7"],
    ["loop_ready", "loop-ready: woken, waiting for the event loop", "#ae3ec9"],
    ["unknown", "unknown: running time no reading covered", "#ced4da"]];
  var PALETTE = ["#4c6ef5", "#12b886", "#fab005", "#f76707", "#7950f2", "#15aabf", "#e64980", "#82c91e", "#fd7e14", "#228be6"];
  function el(tag, cls, text) { var e = document.createElement(tag); if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text); return e; }
  function key(p) { return JSON.stringify(p); }
  // a path as people read it (snapshot.path_shown): names as written; one holding "/" (or starting with '"') quoted
  function pathText(p) { return p.map(function (n) { return /\//.test(n) || n.charAt(0) === '"' ? '"' + n.replace(/"/g, '""') + '"' : n; }).join("/"); }
  function ms(ns) { if (ns === null || ns === undefined) return "n/a"; var v = ns / 1e6;
    return v >= 10000 ? v.toFixed(0) : v >= 100 ? v.toFixed(1) : v >= 1 ? v.toFixed(2) : v >= 0.01 ? v.toFixed(3) : v.toFixed(4); }
  function human(ns) { if (ns === null || ns === undefined) return "n/a";
    var u = [["s", 1e9], ["ms", 1e6], ["\u00b5s", 1e3], ["ns", 1]], i = 0;
    while (i < 3 && Math.abs(ns) < u[i][1]) i++;
    var v = ns / u[i][1], d = v ? Math.max(0, 2 - Math.floor(Math.log10(Math.abs(v)))) : 0;
    return v.toFixed(d) + " " + u[i][0]; }
  function count(x) { return x === null || x === undefined ? "n/a" : Number.isInteger(x) ? x.toLocaleString("en-US") : x.toPrecision(4); }
  function si(x) { if (x === null || x === undefined) return "n/a"; var p = [["G", 1e9], ["M", 1e6], ["k", 1e3], ["", 1]], i = 0;
    while (i < 3 && Math.abs(x) < p[i][1]) i++; var v = x / p[i][1], d = v ? Math.max(0, 2 - Math.floor(Math.log10(Math.abs(v)))) : 0;
    return v.toFixed(d) + p[i][0]; }
  function pct(x) { if (x === null || x === undefined) return "n/a"; var t = (100 * x).toFixed(1); return (t === "-0.0" ? "0.0" : t) + "%"; }
  function change(b, a) { if (b === null || b === undefined || a === null || a === undefined || !b) return null; return a / b - 1; }
  function signed(c) { if (c === null) return "n/a"; var x = 100 * c;
    return (x > 0.05 ? "+" : x < -0.05 ? "\u2212" : "\u00b1") + Math.abs(x).toFixed(1) + "%"; }

  function index(side) { var m = {}; side.stages.forEach(function (s) { m[key(s.path)] = s; }); return m; }
  var AI = index(A), BI = B ? index(B) : {};
  var DIFF = D.diff || null, TEST = {};   // per path: is the change of the typical call beyond noise?
  if (DIFF) DIFF.rows.forEach(function (r) { TEST[key(r.path)] = r; });
  function noisy(s) { var t = TEST[key(s.path)]; return !t || !t.significant; }

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
    if (DIFF) {
      h.textContent = DIFF.headline;
      var dir = DIFF.test.direction;
      h.className = "headline " + (dir > 0 ? "slower" : dir < 0 ? "faster" : "noise");
      h.setAttribute("data-significant", DIFF.test.significant ? "true" : "false");
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
    tip.appendChild(el("div", "t", pathText(s.path)));
    var t = el("table"), other = B ? (side === A ? BI : AI)[key(s.path)] : null;
    var rows = [["calls", s.calls + (s.errors ? " (" + s.errors + " errors)" : "")]];
    D.metrics.forEach(function (m) { var c = (s.cells || {})[m.name];   // the figures of the table, as it shows them
      if (c && m.name !== "calls" && m.name !== "verdict" && c[1] !== "n/a") rows.push([m.header, c[1]]); });
    rows.push(["share of parent", pct(s.parent)]);
    (s.items || []).forEach(function (it) {
      rows.push([it.name, count(it.total) + " in " + count(it.calls) + " adds" + (it.per_ns === null ? "" :
        " \u00b7 " + human(it.per_ns) + "/" + it.unit + " \u00b7 " + si(it.rate) + " " + it.name + "/s")]); });
    if (s.verdict) rows.push(["verdict", s.verdict + (s.reason ? " \u2014 " + s.reason : "")]);
    Object.keys(s.counters || {}).forEach(function (c) { rows.push([c, s.counters[c]]); });   // in their units
    if (s.estimated) rows.push(["~", "estimated from the calls read under the overhead budget"]);
    if (B) {
      var b = side === A ? other : s, a = side === A ? s : other;
      rows.push(["before \u2192 after", b && a ? human(b.mean) + " \u2192 " + human(a.mean) + " per call (" + signed(change(b.mean, a.mean)) + ")"
        : (b ? "only before" : "only after")]);
      if (b && a) rows.push(["total", human(b.total) + " \u2192 " + human(a.total) + " (" + signed(change(b.total, a.total)) + ")"]);
      var t = TEST[key(s.path)];
      if (t) rows.push([t.significant ? "beyond noise" : "within noise", t.reason]);
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
      c.setAttribute("data-path", pathText(s.path));
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
  function colourAfter(s) { return B ? diffColour(BI[key(s.path)] ? (noisy(s) ? 0 : change(BI[key(s.path)].mean, s.mean)) : null) : shade(rootColour(s.path[0]), s.path.length - 1); }
  function colourBefore(s) { return diffColour(AI[key(s.path)] ? (noisy(s) ? 0 : change(s.mean, AI[key(s.path)].mean)) : null); }
  function redraw() {
    var scale = B ? Math.max(A.total, B.total) : A.total;
    draw(document.getElementById("icicle"), A, scale, colourAfter);
    if (B) { document.getElementById("before-wrap").hidden = false; draw(document.getElementById("icicle-before"), B, scale, colourBefore); }
  }
  if (B) {
    document.getElementById("chart-title").textContent = "After, coloured by change of mean per call";
    var lg = document.getElementById("legend");
    [["faster", diffColour(-0.5)], ["slower", diffColour(0.5)], ["within noise", diffColour(0)], ["on one side only", diffColour(null)]].forEach(function (x) {
      var s = el("span"); var sw = el("span", "sw"); sw.style.background = x[1]; s.appendChild(sw); s.appendChild(document.createTextNode(x[0])); lg.appendChild(s); });
    if (DIFF) DIFF.legend.forEach(function (line) { lg.appendChild(el("div", "hint", line)); });
  }
  redraw();
  window.addEventListener("resize", redraw);

  // ----- table: a column per metric (their cells as the breakdown table shows them); with a diff, before/after
  function splitBar(s) {   // a stacked bar of the stage's own wall time by part; the numbers in its title
    var box = el("div", "split"), parts = s.split || {}, sum = 0;
    PARTS.forEach(function (p) { sum += parts[p[0]] || 0; });
    var whole = Math.max(sum, s.self || 0), lines = [];
    PARTS.forEach(function (p) { var v = parts[p[0]]; if (!v) return;
      var seg = el("span", "seg"); seg.style.width = (100 * v / whole) + "%"; seg.style.background = p[2];
      seg.setAttribute("data-part", p[0]); box.appendChild(seg);
      lines.push(p[1].split(":")[0] + " " + pct(v / (s.self || whole)) + " (" + human(v) + ")"); });
    box.title = lines.join(" \u00b7 ");
    return box;
  }
  function metricColumn(m) { return { h: m.header, title: m.doc, metric: true, name: m.name,
    v: function (s) { var c = (s.cells || {})[m.name]; return c ? c[0] : null; },
    t: function (s) { var c = (s.cells || {})[m.name]; return c ? c[1] : "n/a"; },
    node: m.name === "wall_split" ? function (s) { return s.split ? splitBar(s) : null; } : null }; }
  // the verdict and the split of own time right after the stage name, so they stay in view (the name and the
  // verdict are sticky when the table scrolls sideways)
  var FIRST = ["verdict", "wall_split"];
  function placed(ms) { return ms.filter(function (m) { return FIRST.indexOf(m.name) >= 0; })
    .sort(function (a, b) { return FIRST.indexOf(a.name) - FIRST.indexOf(b.name); })
    .concat(ms.filter(function (m) { return FIRST.indexOf(m.name) < 0; })); }
  function column(h, v, f, change) { return { h: h, v: v, t: function (s) { return f(v(s)); }, change: change }; }
  var cols = [{ h: "stage", v: function (s) { return pathText(s.path); } }].concat(placed(D.metrics.filter(function (m) {
    return !B || ["p50", "cpu_per_wall", "root", "self", "tail"].indexOf(m.name) < 0;   // room for the comparison
  })).map(metricColumn));
  function after(name) { var h = D.metrics.filter(function (m) { return m.name === name; })[0].header;
    return cols.map(function (c) { return c.h; }).indexOf(h) + 1; }
  if (B) {
    var beforeTotal = column("before ms", function (s) { var b = BI[key(s.path)]; return s.onlyBefore ? s.total : b ? b.total : null; }, ms);
    var beforeMean = column("before mean ms", function (s) { var b = BI[key(s.path)]; return s.onlyBefore ? s.mean : b ? b.mean : null; }, ms);
    beforeTotal.before = beforeMean.before = true;
    cols.splice(after("total"), 0, beforeTotal,
      column("\u0394 total", function (s) { var b = BI[key(s.path)]; return b ? change(b.total, s.total) : null; }, signed, true));
    cols.splice(after("mean"), 0, beforeMean,
      column("\u0394 mean", function (s) { var b = BI[key(s.path)]; return b ? change(b.mean, s.mean) : null; }, signed, true),
      column("beyond noise?", function (s) { var t = TEST[key(s.path)]; return t ? (t.significant ? (t.direction > 0 ? "slower" : "faster") : "~ within noise") : null; }, String));
  }
  var rows = A.stages.slice();
  if (B) B.stages.forEach(function (s) { if (!AI[key(s.path)]) rows.push(Object.assign({ onlyBefore: true }, s)); });
  var sortCol = null, sortDesc = true;
  function renderTable() {
    var t = document.getElementById("table"); while (t.firstChild) t.removeChild(t.firstChild);
    var thead = el("thead"), hr = el("tr");
    cols.forEach(function (c, i) { var th = el("th", c.name === "verdict" ? "verdict" : null, c.h + (sortCol === i ? (sortDesc ? " \u25be" : " \u25b4") : ""));
      if (c.title) th.title = c.title;
      th.addEventListener("click", function () { if (sortCol === i) { if (!sortDesc) sortCol = null; sortDesc = !sortDesc; } else { sortCol = i; sortDesc = i !== 0; } renderTable(); });
      hr.appendChild(th); });
    thead.appendChild(hr); t.appendChild(thead);
    var list = rows.slice();
    if (sortCol !== null) { var f = cols[sortCol].v;
      list.sort(function (x, y) { var a = f(x), b = f(y); if (a === null) return 1; if (b === null) return -1; var r = a < b ? -1 : a > b ? 1 : 0; return sortDesc ? -r : r; }); }
    var tb = el("tbody"), maxTotal = Math.max.apply(null, rows.map(function (s) { return s.total; }).concat([1]));
    list.forEach(function (s) {
      var tr = el("tr"), name = el("td", "name");
      name.style.paddingLeft = (10 + (sortCol === null ? 16 * (s.path.length - 1) : 0)) + "px";
      var bar = el("span", "bar"); bar.style.width = Math.max(2, 60 * s.total / maxTotal) + "px"; name.appendChild(bar);
      name.appendChild(document.createTextNode(sortCol === null ? s.path[s.path.length - 1] : pathText(s.path)));
      name.title = pathText(s.path);
      (s.items || []).forEach(function (it) { if (it.per_ns !== null)
        name.appendChild(el("span", "items", human(it.per_ns) + "/" + it.unit + " \u00b7 " + si(it.rate) + " " + it.name + "/s")); });
      if (s.onlyBefore) name.appendChild(el("span", "tag", "only before"));
      else if (B && !BI[key(s.path)]) name.appendChild(el("span", "tag", "only after"));
      tr.appendChild(name);
      cols.slice(1).forEach(function (c) {
        var hidden = s.onlyBefore && !c.before, v = hidden ? null : c.v(s);   // a stage only before: its before figures
        var text = hidden || (!c.metric && (v === null || v === undefined)) ? "n/a" : c.t(s);
        var quiet = c.change && !s.onlyBefore && BI[key(s.path)] && noisy(s) &&
          (c.h === "\u0394 mean" || (c.h === "\u0394 total" && BI[key(s.path)].calls === s.calls));
        var bar = !hidden && c.node ? c.node(s) : null;
        var td = bar ? el("td", "bar-cell") : el("td", c.name === "verdict" ? "verdict" : null, (quiet ? "~" : "") + text);
        if (bar) td.appendChild(bar);
        else if (text === "n/a") td.className = "na" + (c.name === "verdict" ? " verdict" : "");
        else if (quiet) { td.className = "noise"; td.title = "within noise: " + TEST[key(s.path)].reason; }
        else if (c.h === "beyond noise?") td.className = v === "slower" ? "up" : v === "faster" ? "down" : "noise";
        else if (c.change) td.className = v > 0.005 ? "up" : v < -0.005 ? "down" : "";
        tr.appendChild(td);
      });
      tr.addEventListener("mousemove", function (ev) { showTip(ev, s, s.onlyBefore ? B : A); });
      tr.addEventListener("mouseleave", hideTip);
      tb.appendChild(tr);
    });
    t.appendChild(tb);
    t.style.setProperty("--name-w", thead.firstChild.firstChild.offsetWidth + "px");   // where the sticky verdict sits
  }
  renderTable();

  // ----- what the table's marks mean
  (function tableLegend() {
    var box = document.getElementById("table-legend");
    if (A.stages.some(function (s) { return s.split; })) {
      var key = el("div", "parts"); key.appendChild(document.createTextNode("own time: "));
      PARTS.forEach(function (p) { var x = el("span"), sw = el("span", "sw"); sw.style.background = p[2];
        x.appendChild(sw); x.appendChild(document.createTextNode(p[1])); key.appendChild(x); });
      box.appendChild(key);
    }
    [["n/a", "not measured for this stage: CPU time, user/system time and counters are left out for calls that " +
      "overlapped other asyncio tasks on their thread (an await with no task-switch hook), never mixed with the " +
      "other tasks' time; system time needs the cpu_split option; a counter is n/a where this machine could not open it"],
     ["\u2212 / negative", "tail%: the stage took less time in the slow calls than in typical ones, so it offset part " +
      "of their excess (the shares add up to 100 %); \u0394 columns: faster than before"],
     ["~", "estimated from the calls read under the overhead budget; \u00b1 its 99 % interval"],
     ["?", "unknown: an estimate whose 99 % interval is wider than the figure itself"]].forEach(function (x) {
      var d = el("div"); d.appendChild(el("b", null, x[0])); d.appendChild(document.createTextNode(" " + x[1])); box.appendChild(d); });
  })();

  // ----- tail: which stage the slow calls lost their time in
  (function tails() {
    var box = document.getElementById("tails");
    if (!A.tails || !A.tails.length) return;
    document.getElementById("tail-card").hidden = false;
    A.tails.forEach(function (v) {
      var q = "p" + String(Math.round(v.quantile * 1000) / 10).replace(".", "");
      var h = el("div", "tail-head");
      h.appendChild(el("b", null, pathText(v.stage)));
      h.appendChild(document.createTextNode(": " + v.calls.toLocaleString("en-US") + " calls, p50 " + human(v.p50_ns) +
        ", p99 " + human(v.p99_ns) + "; " + v.slow_calls + " kept calls at or above " + q + " (" + human(v.threshold_ns) +
        "), mean " + human(v.slow_mean_ns) + (v.typical_mean_ns === null ? "" : " against a typical " +
        human(v.typical_mean_ns) + ": " + human(v.excess_ns) + " more")));
      box.appendChild(h);
      var t = el("table"), hr = el("tr");
      ["stage", "slow ms", "typical ms", "excess ms", "share"].forEach(function (x) { hr.appendChild(el("th", null, x)); });
      var th = el("thead"); th.appendChild(hr); t.appendChild(th);
      var tb = el("tbody");
      v.excess.slice(0, 15).forEach(function (e) {
        var tr = el("tr"), name = el("td", "name"), bar = el("span", "bar");
        bar.style.width = Math.max(2, 80 * Math.max(0, e.share || 0)) + "px";
        name.appendChild(bar); name.appendChild(document.createTextNode(pathText(e.path))); tr.appendChild(name);
        tr.appendChild(el("td", null, ms(e.slow_ns))); tr.appendChild(el("td", null, ms(e.typical_ns)));
        tr.appendChild(el("td", e.ns > 0 ? "up" : "", (e.ns > 0 ? "+" : e.ns < 0 ? "\u2212" : "") + ms(Math.abs(e.ns))));
        tr.appendChild(el("td", null, pct(e.share)));
        tb.appendChild(tr);
      });
      t.appendChild(tb); box.appendChild(t);
    });
  })();

  // ----- ranks: time per step of each stage on each rank, as a heat map per row
  (function ranks() {
    var R = D.ranks;
    if (!R) return;
    document.getElementById("ranks-card").hidden = false;
    var box = document.getElementById("ranks-summary");
    R.summary.forEach(function (line) { box.appendChild(el("p", null, line)); });
    var cols = R.ranks.concat(R.missing).sort(function (a, b) { return a - b; });
    var t = document.getElementById("ranks"), hr = el("tr");
    hr.appendChild(el("th", null, "stage"));
    cols.forEach(function (r) {
      var missing = R.missing.indexOf(r) >= 0, stopped = R.stopped.indexOf(r) >= 0;
      hr.appendChild(el("th", missing ? "missing" : null, "rank " + r + (missing ? " (missing)" : stopped ? " (stopped)" : "")));
    });
    var th = el("thead"); th.appendChild(hr); t.appendChild(th);
    var tb = el("tbody");
    R.stages.forEach(function (x) {
      var tr = el("tr"), name = el("td", "name");
      name.appendChild(document.createTextNode("\u00a0".repeat(2 * (x.path.length - 1)) +
        x.path[x.path.length - 1] + (x.device ? " (device)" : "")));
      tr.appendChild(name);
      var lo = x.min_ns, span = Math.max(x.max_ns - lo, x.median_ns / 2);   // a spread of a few % stays pale
      cols.forEach(function (r) {
        var v = x.ns_per_step[String(r)];
        if (v === undefined) { tr.appendChild(el("td", "na", "\u2014")); return; }
        var f = span > 0 ? (v - lo) / span : 0, c = el("td", "heat" + (r === x.slowest_rank && f > 0.5 ? " slowest" : ""), ms(v));
        c.style.background = "rgba(224,49,49," + (0.08 + 0.6 * f).toFixed(3) + ")";
        if (x.wait_ns_per_step) c.title = "waited " + ms(x.wait_ns_per_step[String(r)]) + " ms per step";
        tr.appendChild(c);
      });
      tb.appendChild(tr);
    });
    t.appendChild(tb);
  })();
  document.documentElement.setAttribute("data-rendered", "1");
})();
