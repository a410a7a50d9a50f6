"""The per-stage breakdown as text: an indented tree, one row per stage.

Columns appear when the snapshot has their data (counters, GPU time, verdicts);
the base set fits an 80-column terminal.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from ..snapshot import Snapshot, StageStats

SORTS = ("tree", "total", "self", "calls", "p99", "mean", "name", "cpu")
FORMATS = ("table", "markdown", "csv", "json")


def ms(ns: Optional[float]) -> str:
    if ns is None:
        return "n/a"
    v = ns / 1e6
    if v >= 10000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.01:
        return f"{v:.3f}"
    return f"{v:.4f}"


def pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def ratio(x: Optional[float], digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if digits == 2 and x >= 9.995:   # keep to four characters
        return f"{x:.0f}" if x < 99.5 else "99+"
    return f"{x:.{digits}f}"


@dataclass(frozen=True)
class Column:
    header: str
    width: int
    value: Callable[[Snapshot, StageStats], str]
    raw: Callable[[Snapshot, StageStats], object]
    wants: Callable[[Snapshot], bool] = lambda snap: True


def _counter_derived(s: StageStats, key: str):
    from .. import counters
    totals = {k: v.get("total") for k, v in s.counters.items()}
    return counters.derived(totals, s.wall_total, s.cpu_total).get(key)


def _has_counter(*names: str) -> Callable[[Snapshot], bool]:
    return lambda snap: any(s.counter(n) is not None for s in snap for n in names)


COLUMNS: List[Column] = [
    Column("calls", 6, lambda n, s: str(s.calls), lambda n, s: s.calls),
    Column("total ms", 8, lambda n, s: ms(s.wall_total), lambda n, s: s.wall_total),
    Column("%root", 5, lambda n, s: pct(n.share_of_root(s)), lambda n, s: n.share_of_root(s)),
    Column("mean", 6, lambda n, s: ms(s.wall_mean), lambda n, s: s.wall_mean),
    Column("p50", 6, lambda n, s: ms(s.quantile(0.5)), lambda n, s: s.quantile(0.5)),
    Column("p99", 6, lambda n, s: ms(s.quantile(0.99)), lambda n, s: s.quantile(0.99)),
    Column("self ms", 7, lambda n, s: ms(s.wall_self), lambda n, s: s.wall_self),
    Column("CPU ms", 7, lambda n, s: ms(s.cpu_total), lambda n, s: s.cpu_total),
    Column("C/W", 4, lambda n, s: ratio(s.cpu_ratio), lambda n, s: s.cpu_ratio),
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
BASE = 9   # the first nine columns always show


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
    cols = COLUMNS[:BASE]
    extra = [c for c in COLUMNS[BASE:] if c.wants(snap)]
    if width is None:
        return cols + extra
    used = 16 + sum(c.width + 1 for c in cols)
    for c in extra:
        if used + c.width + 1 <= width:
            cols.append(c)
            used += c.width + 1
    return cols


def render(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
           format: str = "table", width: Optional[int] = None, columns: Optional[Sequence[str]] = None,
           title: Optional[str] = None) -> str:
    """The breakdown of `snap`.  width: terminal columns (default: the terminal's,
    at least 80); extra columns are added while they fit."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if depth is not None and (not isinstance(depth, int) or depth < 1):
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    if fold:
        snap = snap.fold()
    rows = ordered(snap, sort, depth)
    if format == "json":
        return json.dumps([dict(s.to_dict(), share_of_root=snap.share_of_root(s)) for s in rows], indent=2)
    if width is None:
        width = max(80, shutil.get_terminal_size((80, 24)).columns) if format == "table" else None
    cols = choose_columns(snap, width, columns)
    if format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["path"] + [c.header for c in cols])
        for s in rows:
            w.writerow(["/".join(s.path)] + [c.raw(snap, s) for c in cols])
        return buf.getvalue()
    if format == "markdown":
        lines = ["| stage | " + " | ".join(c.header for c in cols) + " |",
                 "| --- | " + " | ".join("---:" for _ in cols) + " |"]
        for s in rows:
            name = "&nbsp;" * (2 * s.depth) + _md(s.name)
            lines.append(f"| {name} | " + " | ".join(c.value(snap, s) for c in cols) + " |")
        return "\n".join(lines)
    name_w = max(10, min(40, (width or 80) - sum(c.width + 1 for c in cols)))
    head = f"{'stage':<{name_w}}" + "".join(f" {c.header:>{c.width}}" for c in cols)
    lines = []
    if title:
        lines.append(title)
    lines += [head, "-" * len(head)]
    for s in rows:
        label = "  " * s.depth + _printable(s.name)
        if len(label) > name_w:
            label = label[: name_w - 1] + "…"
        lines.append(f"{label:<{name_w}}" + "".join(f" {c.value(snap, s):>{c.width}}" for c in cols))
    if not rows:
        lines.append("(no stages recorded)")
    total = snap.total_ns
    lines.append(f"{len(rows)} stages, {ms(total)} ms in top-level stages")
    return "\n".join(lines)


def _printable(name: str) -> str:
    """Control characters shown escaped, so a stage name cannot move the cursor."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def _md(name: str) -> str:
    return _printable(name).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
