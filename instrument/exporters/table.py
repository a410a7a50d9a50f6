"""Text forms: the per-stage breakdown (an indented tree, one row per stage),
a before/after diff, the advice, a stage's torch operators, and the tail view
(which stage the slow calls of a root stage lost their time in).

Columns appear when the snapshot has their data (counters, GPU time, verdicts);
the core set fits an 80-column terminal.  Each column is a metric of
instrument.analysis.metrics.  Each renders as a terminal table,
markdown, CSV or JSON.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
import textwrap
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..analysis import metrics as _metrics
from ..analysis.diff import METRICS, Change, Diff, DiffRow, metric_text
from ..analysis.metrics import Metric, ordered
from ..analysis.significance import Significance
from ..analysis.tail import TailView
from ..snapshot import Snapshot, StageStats
from .format import (ESTIMATE, MINUS, cell, count, human, md, ms, name as name_display, path_text, pct, per_unit,
                     printable, rate, signed_percent)

FORMATS = ("table", "markdown", "csv", "json")
NAME_MIN = 14                    # the stage name column narrows to this before a core column is left out
NAME_MAX = 40                    # and is never wider
DROPPABLE = ("cpu_per_wall", "p50", "self", "tail", "mean", "root")   # core columns left out, in this order, when
#                                                                       the terminal is too narrow


def label(s: StageStats, width: Optional[int] = None) -> str:
    """A stage's name as the first column shows it: indented by its depth, cut to `width` with '…'."""
    text = "  " * s.depth + name_display(s.name)
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _choose(snap: Snapshot, width: Optional[int], names: Optional[Sequence[str]] = None,
            width_of: Callable[[Metric], int] = lambda m: m.column_width):
    """The columns (metrics) that fit `width` (each `width_of(metric)` wide), and those with data that did not fit."""
    if names:
        by: Dict[str, Metric] = {}
        for m in _metrics.METRICS.values():
            by.update({m.header.lower(): m, m.field: m, m.name: m})
        bad = [n for n in names if n.lower() not in by]
        if bad:
            raise ValueError(f"unknown column {', '.join(bad)}; the columns are: "
                             f"{', '.join(m.name for m in _metrics.METRICS.values())}")
        return [by[n.lower()] for n in names], []
    shown = _metrics.wanted(snap)
    cols = [m for m in shown if m.core]
    extra = [m for m in shown if not m.core]
    if width is None:
        return cols + extra, []
    dropped = []
    for name in DROPPABLE:
        if NAME_MIN + sum(width_of(m) + 1 for m in cols) > width:
            dropped += [m for m in cols if m.name == name]
            cols = [m for m in cols if m.name != name]
    longest = max((len(label(s)) for s in snap), default=0)
    used = max(16, min(NAME_MAX, longest)) + sum(width_of(m) + 1 for m in cols)   # names stay whole if they can
    for m in extra:
        if used + width_of(m) + 1 <= width:
            cols.append(m)
            used += width_of(m) + 1
        else:
            dropped.append(m)
    order = list(_metrics.METRICS.values())
    return sorted(cols, key=order.index), dropped


def item_names(snap: Snapshot) -> List[str]:
    return list(dict.fromkeys(n for s in snap for n in s.items))


def item_lines(s: StageStats, indent: str) -> List[str]:
    """`tokens: 8,000 in 400 adds · 2.51 µs/token · 398k tokens/s` for each item of the stage."""
    out = []
    for name, it in s.items.items():
        line = f"{indent}{printable(name)}: {count(it['total'])} in {count(it['calls'])} add{'s' if it['calls'] != 1 else ''}"
        if it["total"] and s.wall_total:
            line += f" · {per_unit(s.per_item_ns(name), name)} · {rate(s.item_rate(name), name)}"
        out.append(line)
    return out


def overhead_line(snap: Snapshot) -> Optional[str]:
    """The SDK's own estimated cost (meta.overhead) as a share of the wall time the snapshot recorded."""
    o = snap.meta.get("overhead")
    if not isinstance(o, dict) or o.get("estimated_ns") is None:
        return None
    total = snap.total_ns
    p = 100 * o["estimated_ns"] / total if total else None
    share = "" if p is None else f"{p:.0f} % of the recorded wall time; " if p >= 10 else \
        f"{p:.2g} % of the recorded wall time; "
    return (f"instrument's own cost: ~{ms(o['estimated_ns'])} ms ({share}{o.get('read_calls', 0):,} of "
            f"{o.get('calls', 0):,} calls read)")


def backend_line(snap: Snapshot) -> Optional[str]:
    """Where a backend other than the C core recorded the snapshot: which, why, and what it lacks (meta.backend)."""
    b = snap.meta.get("backend")
    if not isinstance(b, dict) or not b.get("missing"):
        return None
    return f"recorded by the {b.get('name')} backend ({b.get('reason')}); it lacks: {', '.join(b['missing'])}"


def _json_row(snap: Snapshot, s: StageStats, cols: Sequence[Metric]) -> Dict[str, Any]:
    """The stage as the snapshot records it, plus each metric's field; where the record has that key (calls,
    verdict) the record's is kept: the same figure, or more of it (the verdict with its reason)."""
    d = s.to_dict()
    for k, v in _metrics.row(snap, s, list(cols)).items():
        d.setdefault(k, v)
    for name, it in d.get("items", {}).items():
        it.update(ns_per_item=s.per_item_ns(name), per_second=s.item_rate(name))
    return d


def render(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
           format: str = "table", width: Optional[int] = None, columns: Optional[Sequence[str]] = None,
           title: Optional[str] = None, below: Optional[Callable[[StageStats, str], List[str]]] = None) -> str:
    """The breakdown of `snap`.  width: terminal columns (default: the terminal's,
    at least 80); extra columns are added while they fit.  Under each row (table and
    markdown) go the stage's items with their per-item cost and rate, or what
    `below(stage, indent)` returns."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if depth is not None and (not isinstance(depth, int) or depth < 1):
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    if fold:
        snap = snap.fold()
    rows = ordered(snap, sort, depth)
    if width is None:
        width = max(80, shutil.get_terminal_size((80, 24)).columns) if format == "table" else None
    texts = {m.name: [cell(m, snap, s) for s in rows] for m in _metrics.wanted(snap)}
    cols, dropped = _choose(snap, width, columns,
                            lambda m: max([m.column_width] + [len(t) for t in texts.get(m.name, ())]))
    if format == "json":   # times in ns (wall_ns, cpu_ns, total_ns), root_pct and tail_pct in percent
        return json.dumps([_json_row(snap, s, cols) for s in rows], indent=2, allow_nan=False)
    if format == "csv":
        names = item_names(snap)
        cells = [{k: v for m in cols for k, v in m.fields(m.value(snap, s)).items()} for s in rows]
        fields = list(dict.fromkeys(k for c in cells for k in c)) if cells else [m.field for m in cols]
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["path"] + fields + [h for n in names for h in (n, f"ns/{n}", f"{n}/s")])
        for s, c in zip(rows, cells):
            w.writerow([path_text(s.path)] + [c.get(f) for f in fields]
                       + [v for n in names for v in (s.item_total(n), s.per_item_ns(n), s.item_rate(n))])
        return buf.getvalue()
    below = below or item_lines
    if format == "markdown":
        lines = ["| stage | " + " | ".join(m.header for m in cols) + " |",
                 "| --- | " + " | ".join("---:" for _ in cols) + " |"]
        notes = []
        for s in rows:
            name = "&nbsp;" * (2 * s.depth) + md(name_display(s.name))
            lines.append(f"| {name} | " + " | ".join(md(cell(m, snap, s)) for m in cols) + " |")
            extra = below(s, "    ")
            if extra:
                notes += ["", f"**{md(path_text(s.path))}**", "", "```", *extra, "```"]
        return "\n".join(lines + notes)
    widths = [max([m.column_width] + [len(t) for t in texts.get(m.name, ())]) for m in cols]
    name_w = max(10, min(NAME_MAX, (width or 80) - sum(w + 1 for w in widths)))
    head = f"{'stage':<{name_w}}" + "".join(f" {m.header:>{w}}" for m, w in zip(cols, widths))
    lines = []
    if title:
        lines.append(title)
    lines += [head, "-" * len(head)]
    for s in rows:
        lines.append(f"{label(s, name_w):<{name_w}}" + "".join(f" {cell(m, snap, s):>{w}}" for m, w in zip(cols, widths)))
        lines += below(s, "  " * (s.depth + 2))
    if not rows:
        lines.append("(no stages recorded)")
    total = snap.total_ns
    lines.append(f"{len(rows)} stages, {ms(total)} ms in top-level stages")
    overlapped = sum(s.overlapped_calls for s in rows)
    if overlapped:
        lines.append(f"{overlapped} calls overlapped other asyncio tasks on their thread with no task-switch hook: "
                     "their CPU time and counters are left out (n/a), never summed")
    sampled = [s for s in rows if s.cpu_estimated or any(c.get("estimated") for c in s.counters.values())]
    if sampled:
        reads = sum(s.cpu_reads for s in sampled)
        calls = sum(s.cpu_calls for s in sampled)
        lines += textwrap.wrap(f"{ESTIMATE} estimated: {len(sampled)} stage{'s' if len(sampled) != 1 else ''} too short "
                               "for a read on every call within "
                               f"the overhead budget had {reads:,} of {calls:,} calls read (overhead_budget=None reads "
                               "every call)", width or 80)
    for note in (overhead_line(snap), backend_line(snap)):
        if note:
            lines += textwrap.wrap(note, width or 80)
    if dropped:
        lines += textwrap.wrap(f"not shown at {width} columns: {', '.join(m.header for m in dropped)} (a wider "
                               "terminal, COLUMNS=160, or --format csv/json shows them)", width)
    return "\n".join(lines)


# ------------------------------------------------------------------ operators
def ops_lines(ops: Any, indent: str) -> List[str]:
    """The torch operators of a stage, as far as the record has them; device time
    only where a device ran (a CPU-only profile has none to show)."""
    if not isinstance(ops, dict):
        return []
    rows_of = {k: [r for r in (ops.get(k) or []) if isinstance(r, dict)] if isinstance(ops.get(k), list) else []
               for k in ("by_self_cpu", "by_device")}
    device = bool(ops.get("device_total_ns")) or any(r.get("device_ns") for rows in rows_of.values() for r in rows)
    out = []
    for key, title in (("by_self_cpu", "ops by self CPU"), ("by_device", "ops by device time")):
        rows = rows_of[key]
        if not rows:
            continue
        out.append(f"{indent}{title}:")
        for r in rows[:10]:
            name = printable(str(r.get("name", "?")))
            name = name if len(name) <= 40 else name[:39] + "…"
            line = f"{indent}  {name:<40} {r.get('calls', 0):>7} calls  {ms(r.get('self_cpu_ns')):>8} ms CPU"
            if device:
                line += f"  {ms(r.get('device_ns')):>8} ms device"
            out.append(line)
    if device:
        out.append(f"{indent}device total: {ms(ops['device_total_ns'])} ms" if ops.get("device_total_ns") is not None
                   else f"{indent}device total: n/a")
    return out


def render_with_ops(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
                    format: str = "table", width: Optional[int] = None) -> str:
    """The breakdown with each stage's items and torch operators under its row (table and markdown), saying so
    where no operators were recorded."""
    text = render(snap, sort=sort, depth=depth, fold=fold, format=format, width=width,
                  below=lambda s, indent: item_lines(s, indent) + ops_lines(s.ops, indent))
    if format in ("table", "markdown") and not any(s.ops for s in snap):
        text += "\n" + textwrap.fill("no torch operators in this snapshot: they are recorded inside `with "
                                     "instrument.profile():` (torch.profiler) around the calls", width or 80)
    return text


# ------------------------------------------------------------------------ tail
TAIL_FORMATS = ("table", "markdown", "json")


def _q(q: float) -> str:
    return f"p{q * 100:g}".replace(".", "")


def render_tail(views: Sequence[TailView], format: str = "table", limit: Optional[int] = 12,
                snap: Optional[Snapshot] = None) -> str:
    """Per root stage: how much more time each stage took in the calls above the
    quantile ("slow ms": their mean self time) than in a typical call, as time and as
    share of the excess, largest first, with the component of its time that grew most
    and one sentence that says it (naming the stages that held the event loop, from
    `snap`, where that was it).
    JSON: one object per root stage, a list when there are several."""
    if format not in TAIL_FORMATS:
        raise ValueError(f"format must be one of {', '.join(TAIL_FORMATS)}, got {format!r}")
    if format == "json":
        objs = [dict(t.to_dict(), why=t.sentence(snap)) for t in views]
        return json.dumps(objs[0] if len(objs) == 1 else objs, indent=2, allow_nan=False)
    if not views:
        return ("No exemplars in this snapshot: record with the `exemplars` option above 0 (the default is 32) "
                "to see which stage slow calls lose their time in.")
    out: List[str] = []
    for v in views:
        q = _q(v.quantile)
        root = path_text(v.stage)
        head = (f"Tail of {root}: {v.calls:,} calls, p50 {human(v.p50_ns)}, p99 {human(v.p99_ns)}; "
                f"{v.slow_calls} kept call{'s' if v.slow_calls != 1 else ''} at or above {q} ({human(v.threshold_ns)}), "
                f"mean {human(v.slow_mean_ns)}")
        if v.typical_mean_ns is not None:
            head += (f", against a typical call (mean of the middle half of {v.typical_calls} sampled) of "
                     f"{human(v.typical_mean_ns)}: {human(v.total_excess_ns)} more")
        why = v.sentence(snap)
        if why:
            head += f"\n{why[0].upper() + why[1:]}."
        rows = v.excess[:limit] if limit else v.excess
        cells = [[path_text(e.path), ms(e.slow_ns), ms(e.typical_ns),
                  ("+" if e.ns > 0 else MINUS if e.ns < 0 else "") + ms(abs(e.ns)), pct(e.share),
                  f"{e.component} +{ms(e.parts[e.component])}" if e.component else ""] for e in rows]
        hdr = ["stage", "slow ms", "typical ms", "excess ms", "share%", "grew most"]
        if format == "markdown":
            out += [f"**{md(head)}**", "", "| " + " | ".join(hdr) + " |", "| --- | ---: | ---: | ---: | ---: | --- |"]
            out += ["| " + " | ".join([md(c[0])] + c[1:]) + " |" for c in cells]
            out.append("")
            continue
        w0 = min(48, max([len(hdr[0])] + [len(c[0]) for c in cells]))
        widths = [w0] + [max(len(hdr[i]), *(len(c[i]) for c in cells)) if cells else len(hdr[i]) for i in range(1, 6)]

        def line(c):
            first = c[0] if len(c[0]) <= w0 else c[0][: w0 - 1] + "…"
            return (f"{first:<{w0}}" + "".join(f" {x:>{w}}" for x, w in zip(c[1:5], widths[1:5]))
                    + f"  {c[5]:<{widths[5]}}").rstrip()
        out += [head, "", line(hdr), "-" * (sum(widths) + 6)] + [line(c) for c in cells]
        if len(v.excess) > len(rows):
            out.append(f"({len(v.excess) - len(rows)} more stages)")
        out.append("")
    return "\n".join(out).rstrip("\n")


# ---------------------------------------------------------------------- advice
def render_advice(advice: Sequence[Dict[str, Any]], about: Optional[str] = None) -> str:
    """instrument.analysis.advice.advise()'s list as text; `about` names the snapshot it
    judges (needed wherever two are on screen, as after a diff)."""
    lines = [f"Where to look next{' in ' + printable(about) if about else ''} (the stages with the most self time):"]
    for i, a in enumerate(advice, 1):
        share = a["saving_upper_bound"]
        lines.append(f"{i}. {path_text(a['path'])}: {a['verdict']} — {a['reason']}")
        lines.append(f"   self {a['self_ns'] / 1e6:.2f} ms"
                     + (f"; removing it would save at most {share:.0%} of end-to-end time" if share is not None else ""))
        if a.get("tail"):
            lines.append(f"   in slow calls: {a['tail']['text']}")
        lines.append(f"   next: {a['next']}")
    if len(lines) == 1:
        lines.append("   (no stages recorded)")
    return "\n".join(lines)


# ------------------------------------------------------------------------ diff
DIFF_HEADERS = ["calls", "total ms", "→", "Δ ms", "Δ%", "mean ms", "→", "Δ%", "p50 Δ%", "p99 ms", "→", "Δ%",
                "CPU/call Δ%", "change"]
NOISE = "~"   # marks a change not shown to be beyond noise


def percent(c: Change) -> str:
    if c.ratio is None:
        return "n/a" if c.before is None or c.after is None or not c.after else "new"
    return signed_percent(c.ratio)


def relative(x: Optional[float]) -> str:
    """A relative change as a signed percentage: 0.1 -> +10.0%; unbounded ends as ∞."""
    if x is None:
        return "n/a"
    if x == float("inf"):
        return "+∞"
    return signed_percent(1 + x)


def _level(x: float) -> str:
    return f"{100 * x:.2f}".rstrip("0").rstrip(".") + "%"


def significance_text(sig: Significance, what: str = "typical call") -> str:
    """`CPU per call +11.2% (99.9% interval +10.4% … +12.0%, 40 turns)`."""
    if sig.basis == "none":
        return f"{what} untested ({sig.reason})"
    lo, hi = sig.interval or (None, None)
    n = f"{sig.n[0]} turns" if sig.basis == "turns" else f"{sig.n[0]} → {sig.n[1]} {sig.basis}"
    return f"{what} {relative(sig.estimate)} ({_level(sig.level)} interval {relative(lo)} … {relative(hi)}, {n})"


def judgement_text(r: DiffRow) -> str:
    """`slower beyond noise: CPU per call +23.5% (…)`, `within noise: …`, `untested: …`."""
    metric, sig = r.decision
    what = metric_text(metric) if metric else "change"
    if sig.basis == "none":
        return f"untested: {sig.reason}"
    if metric in r.not_evidence:
        return f"not judged: {significance_text(sig, what)}, not evidence ({r.not_evidence[metric]})"
    word = r.judgement
    if word in ("slower", "faster", "mixed"):
        return f"{word} beyond noise: {significance_text(sig, what)}"
    return f"within noise: {significance_text(sig, what)}"


def headline(d: Diff) -> str:
    """One line on the top-level stage: `request: 25.0 ms → 18.1 ms (−27.6%); faster beyond noise: CPU per call
    −27.2% (99.9% interval …)`, or `…; within noise: …`."""
    top = d.row(d.stage) if d.stage else None
    if top is None:
        return "no stages on either side"
    name = name_display(top.name)
    tot = top.metrics["total"]
    if top.status != "both":
        side = tot.before if top.status == "only before" else tot.after
        return f"{name}: {top.status} ({human(side)} total)"
    mean, calls = top.metrics["mean"], top.metrics["calls"]
    if d.change_of != "mean":
        text = f"{name}: total {human(tot.before)} → {human(tot.after)} ({percent(tot)})"
    else:
        text = f"{name}: {human(mean.before)} → {human(mean.after)} ({percent(mean)})"
        if calls.before != calls.after:
            text += (f" per call; total {human(tot.before)} → {human(tot.after)} ({percent(tot)}) over "
                     f"{calls.before:.0f} → {calls.after:.0f} calls")
    return f"{text}; {judgement_text(top)}"


def _ms_or_dash(x: Optional[float]) -> str:
    return ms(x) if x is not None else "-"


def _int_or_dash(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def _signed_ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else ("+" if x > 0 else MINUS) + ms(abs(x))


def _marked(text: str, judged: bool) -> str:
    return text if judged or text in ("n/a", "new", "-") else NOISE + text


def _cpu_cell(r: DiffRow) -> str:
    t = r.tests.get("cpu")
    if t is None or t.estimate is None:
        return "-"
    return _marked(relative(t.estimate), t.significant)


def _diff_cells(r: DiffRow) -> List[str]:
    m = r.metrics
    calls = m["calls"]
    wall = r.tests.get("wall")
    timed = wall is not None and wall.significant and "wall" not in r.not_evidence   # wall judged beyond noise
    change = {"within noise": NOISE + "noise"}.get(r.judgement, r.judgement)
    return [f"{_int_or_dash(calls.before)}→{_int_or_dash(calls.after)}",
            _ms_or_dash(m["total"].before), _ms_or_dash(m["total"].after), _signed_ms(m["total"].delta),
            _marked(percent(m["total"]), timed) if calls.before == calls.after else percent(m["total"]),
            _ms_or_dash(m["mean"].before), _ms_or_dash(m["mean"].after),
            _marked(percent(m["mean"]), timed), _marked(percent(m["p50"]), timed), _ms_or_dash(m["p99"].before),
            _ms_or_dash(m["p99"].after), _marked(percent(m["p99"]), timed), _cpu_cell(r),
            "-" if r.status != "both" else change]


def _diff_label(r: DiffRow) -> str:
    return path_text(r.path) + ("" if r.status == "both" else f" ({r.status})")


def _row_lines(r: DiffRow) -> List[str]:
    """Under a row: its bottleneck verdict, what judged it, wall time where the machine explains it, each
    counted figure per call and the counters no test judges."""
    lines = []
    if any(r.verdict):
        b, a = (v or "-" for v in r.verdict)
        lines.append(f"verdict: {b}" + ("" if a == b else f" → {a}"))
    if r.status == "both" and r.tests:
        lines.append(judgement_text(r))
    for k, t in r.tests.items():
        if k in ("cpu", "wall") or t is r.significance:
            continue
        if t.basis == "none":
            lines.append(f"{NOISE}{metric_text(k)} untested ({t.reason})")
        else:
            lines.append(("" if t.significant else NOISE) + significance_text(t, metric_text(k)))
    wall = r.tests.get("wall")
    if wall is not None and "wall" in r.not_evidence and wall.significant and wall is not r.significance:
        lines.append(f"{significance_text(wall)}: not evidence ({r.not_evidence['wall']})")
    for n, c in r.counters.items():
        if n in r.tests or n == "task-clock" or not (c.before or c.after):   # judged, CPU time, or never counted
            continue
        lines.append(f"{n}: {count(c.before)} → {count(c.after)} ({percent(c)}; not judged: load moves it)")
    return lines


def legend(d: Diff) -> List[str]:
    tests = (f"each of the {d.tests} tests at {_level(1 - d.alpha / d.tests)}, so that all hold together at {_level(1 - d.alpha)} "
             "(Bonferroni)" if d.tests else "no figure of any stage could be tested")
    return [f"basis: {d.basis_reason}", f"machine: {d.machine.line}",
            f"judged on CPU time, instructions, page faults and items per call first, wall time where the machine "
            f"does not explain it; {tests}",
            f"{NOISE} not shown beyond noise: the interval of the change includes no change or reaches within "
            f"±{d.min_change:.0%}, the smallest change claimed"] + [f"warning: {w}" for w in d.warnings]


CSV_TESTS = ["judgement", "basis", "estimate_pct", "interval_low_pct", "interval_high_pct", "p"]
CSV_FIGURES = ("cpu", "wall")


def _test_cells(sig: Significance) -> List[Any]:
    lo, hi = sig.interval_list() or (None, None)
    pct_ = (lambda x: None if x is None else 100 * x)
    return [pct_(sig.estimate), pct_(lo), pct_(hi), sig.p]


# Columns given up, group by group, when a diff table must fit a width: (indices into DIFF_HEADERS + 1, what the
# footer calls them, the header a column left alone in its group then takes)
_DIFF_DROPS = (((2, 3, 4, 5), "total ms before/after/Δ", {}), ((10, 11), "p99 ms before/after", {12: "p99 Δ%"}),
               ((9,), "p50 Δ%", {}), ((13,), "CPU/call Δ%", {}), ((6, 7), "mean ms before/after", {8: "mean Δ%"}))


def render_diff(d: Diff, format: str = "table", limit: Optional[int] = None, width: Optional[int] = None) -> str:
    """The diff as text ('table'), 'markdown', 'csv' or 'json'; limit: at most that many rows; width: the
    text table gives up columns (named in a footer) and wraps its notes to fit that many characters."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    rows = d.rows[:limit] if limit else d.rows
    if format == "json":
        return json.dumps(dict(d.to_dict(), headline=headline(d), rows=[r.to_dict() for r in rows]), indent=2,
                          allow_nan=False)
    if format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        names = list(dict.fromkeys(n for r in rows for n in r.counters))

        def head(m: str, k: str) -> str:
            return f"{m}_{k}" if m == "calls" or k == "ratio" else f"{m}_{k}_ns"
        w.writerow(["path", "status"] + [head(m, k) for m in METRICS for k in ("before", "after", "delta", "ratio")]
                   + CSV_TESTS + [f"{f}_{k}" for f in CSV_FIGURES for k in ("significant", "evidence", "estimate_pct",
                                                                           "interval_low_pct", "interval_high_pct")]
                   + [f"counter:{n}_{k}" for n in names for k in ("before", "after")])
        for r in rows:
            vals = [v for m in METRICS for v in r.metrics[m].to_dict().values()]
            sig = r.significance
            figures = []
            for f in CSV_FIGURES:
                t = r.tests.get(f)
                figures += ([t.significant and f not in r.not_evidence, f not in r.not_evidence]
                            + _test_cells(t)[:3] if t is not None else [None] * 5)
            cs = [v for n in names for v in ((r.counters[n].before, r.counters[n].after) if n in r.counters
                                            else (None, None))]
            w.writerow([path_text(r.path), r.status] + ["" if v is None else v for v in vals]
                       + ["" if v is None else v for v in [r.judgement, sig.basis] + _test_cells(sig)]
                       + ["" if v is None else v for v in figures] + ["" if v is None else v for v in cs])
        return buf.getvalue()
    if format == "markdown":
        out = [f"**{md(headline(d))}**", "", "| stage | " + " | ".join(DIFF_HEADERS) + " |",
               "| --- | " + " | ".join("---:" for _ in DIFF_HEADERS) + " |"]
        for r in rows:
            lines = _row_lines(r)
            extra = "<br>" + "<br>".join(md(x) for x in lines) if lines else ""
            out.append(f"| {md(_diff_label(r))}{extra} | " + " | ".join(md(c) for c in _diff_cells(r)) + " |")
        out += ["", "<br>".join(md(x) for x in legend(d))]
        return "\n".join(out)
    table = [[_diff_label(r)] + _diff_cells(r) for r in rows]
    head = ["stage"] + DIFF_HEADERS
    keep = list(range(len(head)))
    dropped: List[str] = []
    widths = [min(48, max([len(head[0])] + [len(t[0]) for t in table]))] + \
        [max([len(h)] + [len(t[i + 1]) for t in table]) for i, h in enumerate(DIFF_HEADERS)]
    if width is not None:
        widths[0] = min(widths[0], max(16, width // 4))
        for group, what, rename in _DIFF_DROPS:
            if sum(widths[k] + 1 for k in keep) - 1 <= width:
                break
            keep = [k for k in keep if k not in group]
            dropped.append(what)
            for k, h in rename.items():
                head[k] = h
                widths[k] = max(widths[k], len(h))

    def line(cells):
        first = cells[0] if len(cells[0]) <= widths[0] else cells[0][: widths[0] - 1] + "…"
        return f"{first:<{widths[0]}}" + "".join(f" {cells[k]:>{widths[k]}}" for k in keep[1:])

    def wrap(text, indent=""):
        return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ") if width else \
            [indent + text]
    notes = legend(d)
    out = [*wrap(headline(d)), *wrap(notes[0]), *wrap(notes[1]), "", line(head),
           "-" * (sum(widths[k] for k in keep) + len(keep) - 1)]
    for r, cells in zip(rows, table):
        out.append(line(cells))
        for x in _row_lines(r):
            out += wrap(x, "    ")
    if not rows:
        out.append("(no stages on either side)")
    else:
        out.append("")
        for x in notes[2:]:
            out += wrap(x)
    if dropped:
        out += wrap(f"not shown at {width} columns: {', '.join(dropped)} (a wider terminal or --format csv/json "
                    "shows them)")
    return "\n".join(out)
