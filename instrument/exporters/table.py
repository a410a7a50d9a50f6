"""Text forms: the per-stage breakdown (an indented tree, one row per stage),
a before/after diff, the advice, a stage's torch operators, and the tail view
(which stage the slow calls of a root stage lost their time in).

Columns appear when the snapshot has their data (counters, GPU time, verdicts);
the base set fits an 80-column terminal.  Each renders as a terminal table,
markdown, CSV or JSON.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from .. import counters
from ..analysis.diff import METRICS, Change, Diff, DiffRow
from ..analysis.tail import TailView, tail
from ..snapshot import Snapshot, StageStats
from .format import MINUS, count, human, md, ms, pct, per_unit, printable, rate, ratio, signed_percent

SORTS = ("tree", "total", "self", "calls", "p99", "mean", "name", "cpu")
FORMATS = ("table", "markdown", "csv", "json")


@dataclass(frozen=True)
class Column:
    header: str
    width: int
    value: Callable[[Snapshot, StageStats], str]
    raw: Callable[[Snapshot, StageStats], object]
    wants: Callable[[Snapshot], bool] = lambda snap: True
    base: bool = False     # shown whenever it wants to be, before the optional columns


def _counter_derived(s: StageStats, key: str):
    totals = {k: v.get("total") for k, v in s.counters.items()}
    return counters.derived(totals, s.attributed_wall(), s.cpu_total).get(key)   # overlapped calls left out


def _has_counter(*names: str) -> Callable[[Snapshot], bool]:
    return lambda snap: any(s.counter(n) is not None for s in snap for n in names)


_tail_memo: List[Any] = [None, None]   # the last snapshot asked about and its tail views


def _tails(snap: Snapshot) -> Dict[str, TailView]:
    if _tail_memo[0] is not snap:
        _tail_memo[:] = [snap, {v.stage[0]: v for v in tail(snap)}]
    return _tail_memo[1]


def tail_share(snap: Snapshot, s: StageStats) -> Optional[float]:
    """The stage's share (with the stages under it) of its root stage's p99 excess."""
    v = _tails(snap).get(s.path[0])
    return v.share(s.path) if v is not None else None


def _has_tail(snap: Snapshot) -> bool:
    return any((v.total_excess_ns or 0) > 0 for v in _tails(snap).values()) if snap.exemplars else False


COLUMNS: List[Column] = [
    Column("calls", 6, lambda n, s: str(s.calls), lambda n, s: s.calls, base=True),
    Column("total ms", 8, lambda n, s: ms(s.wall_total), lambda n, s: s.wall_total, base=True),
    Column("%root", 5, lambda n, s: pct(n.share_of_root(s)), lambda n, s: n.share_of_root(s), base=True),
    Column("tail%", 5, lambda n, s: pct(tail_share(n, s)), lambda n, s: tail_share(n, s), _has_tail, base=True),
    Column("mean", 6, lambda n, s: ms(s.wall_mean), lambda n, s: s.wall_mean, base=True),
    Column("p50", 6, lambda n, s: ms(s.quantile(0.5)), lambda n, s: s.quantile(0.5), base=True),
    Column("p99", 6, lambda n, s: ms(s.quantile(0.99)), lambda n, s: s.quantile(0.99), base=True),
    Column("self ms", 7, lambda n, s: ms(s.wall_self), lambda n, s: s.wall_self, base=True),
    Column("CPU ms", 7, lambda n, s: ms(s.cpu_total), lambda n, s: s.cpu_total, base=True),
    Column("C/W", 4, lambda n, s: ratio(s.cpu_ratio), lambda n, s: s.cpu_ratio, base=True),
    Column("IPC", 5, lambda n, s: ratio(_counter_derived(s, "ipc")), lambda n, s: _counter_derived(s, "ipc"),
           _has_counter("instructions")),
    Column("miss%", 6, lambda n, s: pct(_counter_derived(s, "cache_miss_ratio")),
           lambda n, s: _counter_derived(s, "cache_miss_ratio"), _has_counter("cache-misses")),
    Column("MPKI", 6, lambda n, s: ratio(_counter_derived(s, "mpki"), 1), lambda n, s: _counter_derived(s, "mpki"),
           _has_counter("cache-misses")),
    Column("brmiss%", 7, lambda n, s: pct(_counter_derived(s, "branch_miss_ratio")),
           lambda n, s: _counter_derived(s, "branch_miss_ratio"), _has_counter("branch-misses")),
    Column("faults", 7, lambda n, s: "n/a" if s.counter("page-faults") is None else f"{s.counter('page-faults'):.0f}",
           lambda n, s: s.counter("page-faults"), _has_counter("page-faults")),
    Column("ctxsw", 6, lambda n, s: "n/a" if s.counter("context-switches") is None else
           f"{s.counter('context-switches'):.0f}", lambda n, s: s.counter("context-switches"),
           _has_counter("context-switches")),
    Column("GPU ms", 7, lambda n, s: ms((s.gpu or {}).get("total_ns")), lambda n, s: (s.gpu or {}).get("total_ns"),
           lambda snap: any(s.gpu for s in snap)),
    Column("verdict", 14, lambda n, s: (s.verdict or {}).get("verdict", ""), lambda n, s: (s.verdict or {}).get("verdict"),
           lambda snap: any(s.verdict for s in snap)),
]
NAME_MIN = 14          # the stage name column narrows to this before a base column is left out
DROPPABLE = ("C/W",)  # base columns left out, in this order, when the terminal is too narrow


def _sort_key(sort: str):
    return {
        "total": lambda s: -s.wall_total, "self": lambda s: -s.wall_self, "calls": lambda s: -s.calls,
        "p99": lambda s: -(s.quantile(0.99) or 0), "mean": lambda s: -(s.wall_mean or 0),
        "name": lambda s: s.name, "cpu": lambda s: -(s.cpu_total or 0),
    }[sort]


def ordered(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None) -> List[StageStats]:
    """Rows in tree order, siblings sorted by `sort`; 'tree' keeps first-seen order."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    out: List[StageStats] = []

    def walk(path):
        kids = snap.children(path)
        if sort != "tree":
            kids = sorted(kids, key=_sort_key(sort))
        for k in kids:
            if depth is None or k.depth < depth:
                out.append(k)
                walk(k.path)
    walk(())
    return out


def choose_columns(snap: Snapshot, width: Optional[int], names: Optional[Sequence[str]] = None) -> List[Column]:
    if names:
        by = {c.header.lower(): c for c in COLUMNS}
        bad = [n for n in names if n.lower() not in by]
        if bad:
            raise ValueError(f"unknown column {', '.join(bad)}; the columns are: {', '.join(c.header for c in COLUMNS)}")
        return [by[n.lower()] for n in names]
    cols = [c for c in COLUMNS if c.base and c.wants(snap)]
    extra = [c for c in COLUMNS if not c.base and c.wants(snap)]
    if width is None:
        return cols + extra
    for name in DROPPABLE:
        if NAME_MIN + sum(c.width + 1 for c in cols) > width:
            cols = [c for c in cols if c.header != name]
    used = 16 + sum(c.width + 1 for c in cols)
    for c in extra:
        if used + c.width + 1 <= width:
            cols.append(c)
            used += c.width + 1
    return cols


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


def _json_row(snap: Snapshot, s: StageStats) -> Dict[str, Any]:
    d = dict(s.to_dict(), share_of_root=snap.share_of_root(s))
    if snap.exemplars:
        d["share_of_tail"] = tail_share(snap, s)
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
    if format == "json":
        return json.dumps([_json_row(snap, s) for s in rows], indent=2, allow_nan=False)
    if width is None:
        width = max(80, shutil.get_terminal_size((80, 24)).columns) if format == "table" else None
    cols = choose_columns(snap, width, columns)
    if format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        names = item_names(snap)
        w.writerow(["path"] + [c.header for c in cols] + [h for n in names for h in (n, f"ns/{n}", f"{n}/s")])
        for s in rows:
            w.writerow(["/".join(s.path)] + [c.raw(snap, s) for c in cols]
                       + [v for n in names for v in (s.item_total(n), s.per_item_ns(n), s.item_rate(n))])
        return buf.getvalue()
    below = below or item_lines
    if format == "markdown":
        lines = ["| stage | " + " | ".join(c.header for c in cols) + " |",
                 "| --- | " + " | ".join("---:" for _ in cols) + " |"]
        notes = []
        for s in rows:
            name = "&nbsp;" * (2 * s.depth) + md(s.name)
            lines.append(f"| {name} | " + " | ".join(c.value(snap, s) for c in cols) + " |")
            extra = below(s, "    ")
            if extra:
                notes += ["", f"**{md('/'.join(s.path))}**", "", "```", *extra, "```"]
        return "\n".join(lines + notes)
    name_w = max(10, min(40, (width or 80) - sum(c.width + 1 for c in cols)))
    head = f"{'stage':<{name_w}}" + "".join(f" {c.header:>{c.width}}" for c in cols)
    lines = []
    if title:
        lines.append(title)
    lines += [head, "-" * len(head)]
    for s in rows:
        label = "  " * s.depth + printable(s.name)
        if len(label) > name_w:
            label = label[: name_w - 1] + "…"
        lines.append(f"{label:<{name_w}}" + "".join(f" {c.value(snap, s):>{c.width}}" for c in cols))
        lines += below(s, "  " * (s.depth + 2))
    if not rows:
        lines.append("(no stages recorded)")
    total = snap.total_ns
    lines.append(f"{len(rows)} stages, {ms(total)} ms in top-level stages")
    overlapped = sum(s.overlapped_calls for s in rows)
    if overlapped:
        lines.append(f"{overlapped} calls overlapped other asyncio tasks on their thread with no task-switch hook: "
                     "their CPU time and counters are left out (n/a), never summed")
    return "\n".join(lines)


# ------------------------------------------------------------------ operators
def ops_lines(ops: Any, indent: str) -> List[str]:
    """The torch operators of a stage, as far as the record has them."""
    if not isinstance(ops, dict):
        return []
    out = []
    for key, title in (("by_self_cpu", "ops by self CPU"), ("by_device", "ops by device time")):
        rows = ops.get(key)
        if not isinstance(rows, list) or not rows:
            continue
        out.append(f"{indent}{title}:")
        for r in rows[:10]:
            if not isinstance(r, dict):
                continue
            name = printable(str(r.get("name", "?")))
            name = name if len(name) <= 40 else name[:39] + "…"
            out.append(f"{indent}  {name:<40} {r.get('calls', 0):>7} calls  {ms(r.get('self_cpu_ns')):>8} ms CPU"
                       f"  {ms(r.get('device_ns')):>8} ms device")
    if ops.get("device_total_ns") is not None:
        out.append(f"{indent}device total: {ms(ops['device_total_ns'])} ms")
    return out


def render_with_ops(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
                    format: str = "table", width: Optional[int] = None) -> str:
    """The breakdown with each stage's items and torch operators under its row (table and markdown)."""
    return render(snap, sort=sort, depth=depth, fold=fold, format=format, width=width,
                  below=lambda s, indent: item_lines(s, indent) + ops_lines(s.ops, indent))


# ------------------------------------------------------------------------ tail
TAIL_FORMATS = ("table", "markdown", "json")


def _q(q: float) -> str:
    return f"p{q * 100:g}".replace(".", "")


def render_tail(views: Sequence[TailView], format: str = "table", limit: Optional[int] = 12) -> str:
    """Per root stage: how much more time each stage took in the calls above the
    quantile ("slow ms": their mean self time) than in a typical call, as time and as
    share of the excess, largest first.
    JSON: one object per root stage, a list when there are several."""
    if format not in TAIL_FORMATS:
        raise ValueError(f"format must be one of {', '.join(TAIL_FORMATS)}, got {format!r}")
    if format == "json":
        objs = [{k: v for k, v in t.to_dict().items()} for t in views]
        return json.dumps(objs[0] if len(objs) == 1 else objs, indent=2, allow_nan=False)
    if not views:
        return ("No exemplars in this snapshot: record with the `exemplars` option above 0 (the default is 32) "
                "to see which stage slow calls lose their time in.")
    out: List[str] = []
    for v in views:
        q = _q(v.quantile)
        root = "/".join(printable(p) for p in v.stage)
        head = (f"Tail of {root}: {v.calls:,} calls, p50 {human(v.p50_ns)}, p99 {human(v.p99_ns)}; "
                f"{v.slow_calls} kept call{'s' if v.slow_calls != 1 else ''} at or above {q} ({human(v.threshold_ns)}), "
                f"mean {human(v.slow_mean_ns)}")
        if v.typical_mean_ns is not None:
            head += (f", against a typical call (mean of the middle half of {v.typical_calls} sampled) of "
                     f"{human(v.typical_mean_ns)}: {human(v.total_excess_ns)} more")
        rows = v.excess[:limit] if limit else v.excess
        cells = [["/".join(printable(p) for p in e.path), ms(e.slow_ns), ms(e.typical_ns),
                  ("+" if e.ns > 0 else MINUS if e.ns < 0 else "") + ms(abs(e.ns)), pct(e.share)] for e in rows]
        hdr = ["stage", "slow ms", "typical ms", "excess ms", "share%"]
        if format == "markdown":
            out += [f"**{md(head)}**", "", "| " + " | ".join(hdr) + " |", "| --- | ---: | ---: | ---: | ---: |"]
            out += ["| " + " | ".join([md(c[0])] + c[1:]) + " |" for c in cells]
            out.append("")
            continue
        w0 = min(48, max([len(hdr[0])] + [len(c[0]) for c in cells]))
        widths = [w0] + [max(len(hdr[i]), *(len(c[i]) for c in cells)) if cells else len(hdr[i]) for i in range(1, 5)]

        def line(c):
            first = c[0] if len(c[0]) <= w0 else c[0][: w0 - 1] + "…"
            return f"{first:<{w0}}" + "".join(f" {x:>{w}}" for x, w in zip(c[1:], widths[1:]))
        out += [head, "", line(hdr), "-" * (sum(widths) + 4)] + [line(c) for c in cells]
        if len(v.excess) > len(rows):
            out.append(f"({len(v.excess) - len(rows)} more stages)")
        out.append("")
    return "\n".join(out).rstrip("\n")


# ---------------------------------------------------------------------- advice
def render_advice(advice: Sequence[Dict[str, Any]]) -> str:
    """instrument.analysis.advice.advise()'s list as text."""
    lines = ["Where to look next (the stages with the most self time):"]
    for i, a in enumerate(advice, 1):
        share = a["saving_upper_bound"]
        lines.append(f"{i}. {'/'.join(printable(p) for p in a['path'])}: {a['verdict']} — {a['reason']}")
        lines.append(f"   self {a['self_ns'] / 1e6:.2f} ms"
                     + (f"; removing it would save at most {share:.0%} of end-to-end time" if share is not None else ""))
        lines.append(f"   next: {a['next']}")
    if len(lines) == 1:
        lines.append("   (no stages recorded)")
    return "\n".join(lines)


# ------------------------------------------------------------------------ diff
DIFF_HEADERS = ["calls", "total ms", "→", "Δ ms", "Δ%", "mean ms", "→", "Δ%", "p50 Δ%", "p99 ms", "→", "Δ%", "CPU Δ%"]


def percent(c: Change) -> str:
    if c.ratio is None:
        return "n/a" if c.before is None or c.after is None or not c.after else "new"
    return signed_percent(c.ratio)


def headline(d: Diff) -> str:
    """One line on the top-level stage: `request: 25.0 ms → 18.1 ms (−27.6%)`."""
    top = d.row(d.stage) if d.stage else None
    if top is None:
        return "no stages on either side"
    name = printable(top.name)
    tot = top.metrics["total"]
    if top.status != "both":
        side = tot.before if top.status == "only before" else tot.after
        return f"{name}: {top.status} ({human(side)} total)"
    mean, calls = top.metrics["mean"], top.metrics["calls"]
    if d.basis != "mean":
        return f"{name}: total {human(tot.before)} → {human(tot.after)} ({percent(tot)})"
    text = f"{name}: {human(mean.before)} → {human(mean.after)} ({percent(mean)})"
    if calls.before != calls.after:
        text += (f" per call; total {human(tot.before)} → {human(tot.after)} ({percent(tot)}) over "
                 f"{calls.before:.0f} → {calls.after:.0f} calls")
    return text


def _ms_or_dash(x: Optional[float]) -> str:
    return ms(x) if x is not None else "-"


def _int_or_dash(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def _signed_ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else ("+" if x > 0 else MINUS) + ms(abs(x))


def _diff_cells(r: DiffRow) -> List[str]:
    m = r.metrics
    calls = m["calls"]
    return [f"{_int_or_dash(calls.before)}→{_int_or_dash(calls.after)}",
            _ms_or_dash(m["total"].before), _ms_or_dash(m["total"].after), _signed_ms(m["total"].delta),
            percent(m["total"]), _ms_or_dash(m["mean"].before), _ms_or_dash(m["mean"].after), percent(m["mean"]),
            percent(m["p50"]), _ms_or_dash(m["p99"].before), _ms_or_dash(m["p99"].after), percent(m["p99"]),
            percent(m["cpu"])]


def _diff_label(r: DiffRow) -> str:
    return "/".join(printable(p) for p in r.path) + ("" if r.status == "both" else f" ({r.status})")


def _counter_lines(r: DiffRow) -> List[str]:
    lines = [f"{n}: {count(c.before)} → {count(c.after)} ({percent(c)})" for n, c in r.counters.items()
             if c.before or c.after]   # counters that stayed 0 or were never counted say nothing
    if any(r.verdict):
        b, a = (v or "-" for v in r.verdict)
        lines.insert(0, f"verdict: {b}" + ("" if a == b else f" → {a}"))
    return lines


def render_diff(d: Diff, format: str = "table", limit: Optional[int] = None) -> str:
    """The diff as text ('table'), 'markdown', 'csv' or 'json'; limit: at most that many rows."""
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
        w.writerow(["path", "status"] + [f"{m}_{k}" for m in METRICS for k in ("before", "after", "delta", "ratio")]
                   + [f"counter:{n}_{k}" for n in names for k in ("before", "after")])
        for r in rows:
            vals = [v for m in METRICS for v in r.metrics[m].to_dict().values()]
            cs = [v for n in names for v in ((r.counters[n].before, r.counters[n].after) if n in r.counters
                                            else (None, None))]
            w.writerow(["/".join(r.path), r.status] + ["" if v is None else v for v in vals + cs])
        return buf.getvalue()
    if format == "markdown":
        out = [f"**{md(headline(d))}**", "", "| stage | " + " | ".join(DIFF_HEADERS) + " |",
               "| --- | " + " | ".join("---:" for _ in DIFF_HEADERS) + " |"]
        for r in rows:
            extra = "<br>" + "<br>".join(md(x) for x in _counter_lines(r)) if _counter_lines(r) else ""
            out.append(f"| {md(_diff_label(r))}{extra} | " + " | ".join(_diff_cells(r)) + " |")
        return "\n".join(out)
    table = [[_diff_label(r)] + _diff_cells(r) for r in rows]
    head = ["stage"] + DIFF_HEADERS
    widths = [min(48, max([len(head[0])] + [len(t[0]) for t in table]))] + \
        [max([len(h)] + [len(t[i + 1]) for t in table]) for i, h in enumerate(DIFF_HEADERS)]

    def line(cells):
        first = cells[0] if len(cells[0]) <= widths[0] else cells[0][: widths[0] - 1] + "…"
        return f"{first:<{widths[0]}}" + "".join(f" {c:>{w}}" for c, w in zip(cells[1:], widths[1:]))
    out = [headline(d), "", line(head), "-" * (sum(widths) + len(widths) - 1)]
    for r, cells in zip(rows, table):
        out.append(line(cells))
        out += ["    " + x for x in _counter_lines(r)]
    if not rows:
        out.append("(no stages on either side)")
    return "\n".join(out)
