"""One self-contained HTML report: an icicle chart of the stage tree sized by
total wall time (hover for the numbers, click to zoom), the breakdown table
under it (with each stage's share of the p99 excess and its items' per-item
cost and rate), the tail view (which stage the slow calls of each top-level
stage lost their time in), for a snapshot with per-rank figures a heat map of
time per step (stage x rank) with the straggler, and with `diff=True` a
comparison of two snapshots.
The table's columns are the metrics of instrument.analysis.metrics, as the
breakdown table shows them.

No network, no CDN: CSS, script and data are inline in the page; they are kept
beside this module as report.html, report.css and report.js (package data).  The data is embedded as
JSON in a non-executed script element with `<`, `>`, `&` and U+2028/9
escaped, and every stage name reaches the page through textContent, so a name
like `<script>...</script>` is shown as text and never runs.
"""
from __future__ import annotations

import html
import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence

from ...analysis import metrics as _metrics
from ...analysis.diff import diff as _diff
from ...analysis.metrics import Bar, Metric
from ...analysis.ranks import rank_view
from ...analysis.tail import tail
from ...analysis.verdict import with_verdicts
from ...snapshot import SPLIT, Snapshot, StageStats
from .. import Option, merged, snapshots
from ..format import cell, counter_text, headline, legend, ranks_summary, unit

NAME = "html"
EXTENSION = ".html"
OPTIONS = (Option("diff", "BEFORE AFTER: the second snapshot compared with the first"),
           Option("title", "the page's title", metavar="TEXT"))
_HERE = os.path.dirname(os.path.abspath(__file__))


def _asset(name: str) -> str:
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        return f.read()

_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def embed_json(data: Any) -> str:
    """JSON that cannot end its <script> element or open a comment."""
    s = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return "".join(_ESCAPES.get(c, c) for c in s)


def _cells(snap: Snapshot, s: StageStats, shown: Sequence[Metric]) -> Dict[str, List[Any]]:
    """Per metric: [the value the table sorts by, the text the breakdown table shows]."""
    out = {}
    for m in shown:
        v = m.value(snap, s)
        key = v.value if isinstance(v, Bar) else v if isinstance(v, (int, float, str)) else None
        out[m.name] = [key, cell(m, snap, s)]
    return out


def _split(snap: Snapshot, s: StageStats) -> Optional[Dict[str, float]]:
    """The stage's own wall time by part (ns), where the wall_split metric has it."""
    if _metrics.METRICS["wall_split"].value(snap, s) is None:
        return None
    return {p: s.split_part(p, True) for p in SPLIT if s.split_part(p, True)}


def _stage(snap: Snapshot, s: StageStats, shown: Sequence[Metric]) -> Dict[str, Any]:
    v = s.verdict or {}
    return {"path": list(s.path), "calls": s.calls, "errors": s.errors, "estimated": s.cpu_estimated,
            "total": s.wall_total, "self": s.wall_self, "mean": s.wall_mean, "parent": snap.share_of_parent(s),
            "items": [{"name": n, "unit": unit(n), "total": it["total"], "calls": it["calls"],
                       "per_ns": s.per_item_ns(n), "rate": s.item_rate(n)} for n, it in s.items.items()],
            "counters": {k: counter_text(k, c["total"]) for k, c in s.counters.items() if c.get("total") is not None},
            "split": _split(snap, s),
            "verdict": v.get("verdict"), "reason": v.get("reason"), "cells": _cells(snap, s, shown)}


def _comparison(d) -> Dict[str, Any]:
    """What the page needs of a diff: per path, whether its change is beyond noise."""
    def test(sig) -> Dict[str, Any]:
        return {"significant": sig.significant, "direction": sig.direction, "basis": sig.basis,
                "estimate": sig.estimate, "interval": sig.interval_list(), "level": sig.level, "reason": sig.reason}
    return {"headline": headline(d), "test": test(d.significance), "legend": legend(d),
            "rows": [dict(test(r.significance), path=list(r.path)) for r in d.rows if r.status == "both"]}


def _side(snap: Snapshot, label: str, shown: Sequence[Metric]) -> Dict[str, Any]:
    m = snap.meta
    procs = list({(p.get("pid"), p.get("host")): p for p in (m.get("merged_from") or [m])}.values())
    span = None   # merged: the wall span of the sources, not the last one's duration
    if m.get("merged_from") and m.get("start_time") is not None and m.get("end_time") is not None:
        span = int((m["end_time"] - m["start_time"]) * 1e9)
    return {"label": label, "stages": [_stage(snap, s, shown) for s in snap], "total": snap.total_ns,
            "processes": len(procs), "pids": [p.get("pid") for p in procs][:50], "host": m.get("host"),
            "argv": m.get("argv"), "start": m.get("start_time"), "end": m.get("end_time"),
            "duration": span if span is not None else m.get("duration_ns"),
            "tails": [v.to_dict() for v in tail(snap)]}


def render(snaps: Sequence[Snapshot], diff: bool = False, title: Optional[str] = None,
           alpha: Optional[float] = None, min_change: Optional[float] = None) -> str:
    """A self-contained HTML report with an icicle chart.

    Several snapshots are merged into one report; with diff=True there must be two,
    BEFORE and AFTER, and the page compares them (each change tested against noise at
    `alpha`, `min_change`: see analysis.diff)."""
    snaps = snapshots(snaps)
    if diff and len(snaps) != 2:
        raise ValueError(f"diff compares exactly two snapshots, BEFORE AFTER; got {len(snaps)}")
    before = with_verdicts(snaps[0]) if diff else None
    after = with_verdicts(snaps[1] if diff else merged(snaps))
    if title is None:
        title = "instrument: before / after" if diff else "instrument: stage breakdown"
    sides = [after] + ([before] if before is not None else [])
    shown = [m for m in _metrics.METRICS.values() if any(m.wanted(x) for x in sides)]
    data: Dict[str, Any] = {"after": _side(after, "after" if diff else "snapshot", shown),
                            "metrics": [{"name": m.name, "header": m.header, "doc": m.doc} for m in shown],
                            "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    if any(s.ranks for s in after):
        view = rank_view(after)
        d = view.to_dict()
        for row, x in zip(d["stages"], view.stages):
            row["path"] = list(x.path)
        data["ranks"] = dict(d, summary=ranks_summary(view))
    if before is not None:
        data["before"] = _side(before, "before", shown)
        opts = {k: v for k, v in (("alpha", alpha), ("min_change", min_change)) if v is not None}
        data["diff"] = _comparison(_diff(before, after, **opts))
    return (_asset("report.html").replace("%%TITLE%%", html.escape(title))
            .replace("%%CSS%%", _asset("report.css")).replace("%%JS%%", _asset("report.js"))
            .replace("%%DATA%%", embed_json(data)))
