"""Before/after comparison of two Snapshots, stage by stage.

    d = instrument.diff.diff(Snapshot.load("before.json"), Snapshot.load("after.json"))
    print(d.headline)            # request: 25.0 ms → 18.1 ms (−27.6%)
    print(instrument.diff.render(d))
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .snapshot import Snapshot, StageStats
from .exporters.table import _printable, ms

FORMATS = ("table", "markdown", "csv", "json")
METRICS = ("calls", "total", "mean", "p50", "p99", "cpu")
MINUS = "\u2212"


@dataclass(frozen=True)
class Change:
    before: Optional[float]
    after: Optional[float]

    @property
    def delta(self) -> Optional[float]:
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def ratio(self) -> Optional[float]:
        return self.after / self.before if self.before and self.after is not None else None

    def to_dict(self) -> Dict[str, Any]:
        return {"before": self.before, "after": self.after, "delta": self.delta, "ratio": self.ratio}


@dataclass(frozen=True)
class DiffRow:
    path: Tuple[str, ...]
    status: str                       # "both", "only before" or "only after"
    metrics: Mapping[str, Change]     # METRICS, in ns (calls: a count)
    counters: Mapping[str, Change]    # each counter's total
    verdict: Tuple[Optional[str], Optional[str]] = (None, None)   # bottleneck verdict before, after

    @property
    def name(self) -> str:
        return self.path[-1]

    def to_dict(self) -> Dict[str, Any]:
        return {"path": list(self.path), "status": self.status,
                **{k: c.to_dict() for k, c in self.metrics.items()},
                "counters": {k: c.to_dict() for k, c in self.counters.items()},
                "verdict": {"before": self.verdict[0], "after": self.verdict[1]}}


@dataclass(frozen=True)
class Diff:
    rows: Tuple[DiffRow, ...]
    headline: str
    stage: Optional[Tuple[str, ...]]   # the top-level stage the headline is about
    change: Optional[float]            # its relative change of mean per call (+0.1 = 10 % slower)

    def to_dict(self) -> Dict[str, Any]:
        return {"headline": self.headline, "stage": list(self.stage) if self.stage else None, "change": self.change,
                "rows": [r.to_dict() for r in self.rows]}


def _values(s: Optional[StageStats]) -> Dict[str, Optional[float]]:
    if s is None:
        return dict.fromkeys(METRICS)
    return {"calls": s.calls, "total": s.wall_total, "mean": s.wall_mean, "p50": s.quantile(0.5),
            "p99": s.quantile(0.99), "cpu": s.cpu_total}


def _row(path, b: Optional[StageStats], a: Optional[StageStats]) -> DiffRow:
    vb, va = _values(b), _values(a)
    names = list(dict.fromkeys([*(b.counters if b else ()), *(a.counters if a else ())]))
    counters = {n: Change(b.counter(n) if b else None, a.counter(n) if a else None) for n in names}
    status = "both" if a is not None and b is not None else "only before" if b is not None else "only after"
    verdict = tuple((s.verdict or {}).get("verdict") if s is not None else None for s in (b, a))
    return DiffRow(path, status, {k: Change(vb[k], va[k]) for k in METRICS}, counters, verdict)


def human(ns: Optional[float]) -> str:
    """Three significant digits: 25.0 ms, 1.23 s, 850 µs."""
    if ns is None:
        return "n/a"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            break
    else:
        unit, scale = "ns", 1
    v = ns / scale
    digits = max(0, 2 - int(math.floor(math.log10(abs(v))))) if v else 0
    return f"{v:.{digits}f} {unit}"


def percent(c: Change) -> str:
    r = c.ratio
    if r is None:
        return "n/a" if c.before is None or c.after is None or not c.after else "new"
    x = (r - 1) * 100
    sign = "+" if round(x, 1) > 0 else MINUS if round(x, 1) < 0 else "±"
    return f"{sign}{abs(x):.1f}%"


def _headline(rows: Dict[Tuple[str, ...], DiffRow]) -> Tuple[str, Optional[Tuple[str, ...]], Optional[float]]:
    roots = [r for p, r in rows.items() if len(p) == 1]
    if not roots:
        return "no stages on either side", None, None
    top = max(roots, key=lambda r: max(r.metrics["total"].before or 0, r.metrics["total"].after or 0))
    name = _printable(top.name)
    tot = top.metrics["total"]
    if top.status != "both":
        side = tot.before if top.status == "only before" else tot.after
        return f"{name}: {top.status} ({human(side)} total)", top.path, None
    mean, calls = top.metrics["mean"], top.metrics["calls"]
    if mean.ratio is None:   # no completed call on a side: compare totals
        return f"{name}: total {human(tot.before)} → {human(tot.after)} ({percent(tot)})", top.path, \
            (tot.ratio - 1 if tot.ratio is not None else None)
    text = f"{name}: {human(mean.before)} → {human(mean.after)} ({percent(mean)})"
    if calls.before != calls.after:
        text += (f" per call; total {human(tot.before)} → {human(tot.after)} ({percent(tot)}) over "
                 f"{calls.before:.0f} → {calls.after:.0f} calls")
    return text, top.path, mean.ratio - 1


def diff(before: Snapshot, after: Snapshot) -> Diff:
    """Per stage path of either snapshot: before, after, delta and ratio of
    calls, total, mean, p50, p99, CPU and each counter's total; rows sorted by
    the absolute change of total wall time."""
    from .verdict import with_verdicts
    before, after = with_verdicts(before), with_verdicts(after)
    paths = list(dict.fromkeys([*(s.path for s in before), *(s.path for s in after)]))
    rows = {p: _row(p, before.get(p), after.get(p)) for p in paths}
    headline, stage, change = _headline(rows)

    def key(r: DiffRow):
        t = r.metrics["total"]
        return -abs((t.after or 0) - (t.before or 0)), r.path
    return Diff(tuple(sorted(rows.values(), key=key)), headline, stage, change)


# ---------------------------------------------------------------- rendering
def _ms(x: Optional[float]) -> str:
    return ms(x) if x is not None else "-"


def _cells(r: DiffRow) -> List[str]:
    m = r.metrics
    calls = m["calls"]
    return [f"{_fmt_int(calls.before)}→{_fmt_int(calls.after)}",
            _ms(m["total"].before), _ms(m["total"].after), _signed_ms(m["total"].delta), percent(m["total"]),
            _ms(m["mean"].before), _ms(m["mean"].after), percent(m["mean"]),
            percent(m["p50"]), _ms(m["p99"].before), _ms(m["p99"].after), percent(m["p99"]), percent(m["cpu"])]


HEADERS = ["calls", "total ms", "→", "Δ ms", "Δ%", "mean ms", "→", "Δ%", "p50 Δ%", "p99 ms", "→", "Δ%", "CPU Δ%"]


def _fmt_int(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def _signed_ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else ("+" if x > 0 else MINUS) + ms(abs(x))


def _label(r: DiffRow) -> str:
    return "/".join(_printable(p) for p in r.path) + ("" if r.status == "both" else f" ({r.status})")


def _counter_lines(r: DiffRow) -> List[str]:
    lines = [f"{n}: {_num(c.before)} → {_num(c.after)} ({percent(c)})" for n, c in r.counters.items()
             if c.before or c.after]   # counters that stayed 0 or were never counted say nothing
    if any(r.verdict):
        b, a = (v or "-" for v in r.verdict)
        lines.insert(0, f"verdict: {b}" + ("" if a == b else f" → {a}"))
    return lines


def _num(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:,.0f}" if float(x).is_integer() else f"{x:.4g}"


def render(d: Diff, format: str = "table", limit: Optional[int] = None) -> str:
    """The diff as text ('table'), 'markdown', 'csv' or 'json'; limit: at most that many rows."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    rows = d.rows[:limit] if limit else d.rows
    if format == "json":
        return json.dumps(dict(d.to_dict(), rows=[r.to_dict() for r in rows]), indent=2, allow_nan=False)
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
        out = [f"**{_md(d.headline)}**", "", "| stage | " + " | ".join(HEADERS) + " |",
               "| --- | " + " | ".join("---:" for _ in HEADERS) + " |"]
        for r in rows:
            label = _md(_label(r))
            extra = "<br>" + "<br>".join(_md(x) for x in _counter_lines(r)) if _counter_lines(r) else ""
            out.append(f"| {label}{extra} | " + " | ".join(_cells(r)) + " |")
        return "\n".join(out)
    table = [[_label(r)] + _cells(r) for r in rows]
    head = ["stage"] + HEADERS
    widths = [min(48, max([len(head[0])] + [len(t[0]) for t in table]))] + \
        [max([len(h)] + [len(t[i + 1]) for t in table]) for i, h in enumerate(HEADERS)]

    def line(cells):
        first = cells[0] if len(cells[0]) <= widths[0] else cells[0][: widths[0] - 1] + "…"
        return f"{first:<{widths[0]}}" + "".join(f" {c:>{w}}" for c, w in zip(cells[1:], widths[1:]))
    out = [d.headline, "", line(head), "-" * (sum(widths) + len(widths) - 1)]
    for r, cells in zip(rows, table):
        out.append(line(cells))
        out += ["    " + x for x in _counter_lines(r)]
    if not rows:
        out.append("(no stages on either side)")
    return "\n".join(out)


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
