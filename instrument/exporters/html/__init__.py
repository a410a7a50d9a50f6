"""One self-contained HTML report: an icicle chart of the stage tree sized by
total wall time (hover for the numbers, click to zoom), the breakdown table
under it (with each stage's share of the p99 excess and its items' per-item
cost and rate), the tail view (which stage the slow calls of each top-level
stage lost their time in), for a snapshot with per-rank figures a heat map of
time per step (stage x rank) with the straggler, and with `before=` a
comparison of two snapshots.

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
from typing import Any, Dict, Optional

from ...analysis.diff import diff
from ...analysis.ranks import rank_view
from ...analysis.tail import tail
from ...analysis.verdict import with_verdicts
from ...snapshot import Snapshot, StageStats
from ..format import unit
from ..ranks import summary
from ..table import headline, legend, tail_share

_HERE = os.path.dirname(os.path.abspath(__file__))


def _asset(name: str) -> str:
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        return f.read()

_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def embed_json(data: Any) -> str:
    """JSON that cannot end its <script> element or open a comment."""
    s = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return "".join(_ESCAPES.get(c, c) for c in s)


def _stage(snap: Snapshot, s: StageStats) -> Dict[str, Any]:
    v = s.verdict or {}
    return {"path": list(s.path), "calls": s.calls, "errors": s.errors, "total": s.wall_total, "self": s.wall_self,
            "mean": s.wall_mean, "p50": s.quantile(0.5), "p99": s.quantile(0.99), "cpu": s.cpu_total,
            "ratio": s.cpu_ratio, "sys": s.sys_share, "estimated": s.cpu_estimated,
            "root": snap.share_of_root(s), "parent": snap.share_of_parent(s),
            "gpu": (s.gpu or {}).get("total_ns"), "tail": tail_share(snap, s) if snap.exemplars else None,
            "items": [{"name": n, "unit": unit(n), "total": it["total"], "calls": it["calls"],
                       "per_ns": s.per_item_ns(n), "rate": s.item_rate(n)} for n, it in s.items.items()],
            "counters": {k: c.get("total") for k, c in s.counters.items() if c.get("total") is not None},
            "verdict": v.get("verdict"), "reason": v.get("reason")}


def _comparison(d) -> Dict[str, Any]:
    """What the page needs of a diff: per path, whether its change is beyond noise."""
    def test(sig) -> Dict[str, Any]:
        return {"significant": sig.significant, "direction": sig.direction, "basis": sig.basis,
                "estimate": sig.estimate, "interval": sig.interval_list(), "level": sig.level, "reason": sig.reason}
    return {"headline": headline(d), "test": test(d.significance), "legend": legend(d),
            "rows": [dict(test(r.significance), path=list(r.path)) for r in d.rows if r.status == "both"]}


def _side(snap: Snapshot, label: str) -> Dict[str, Any]:
    m = snap.meta
    procs = list({(p.get("pid"), p.get("host")): p for p in (m.get("merged_from") or [m])}.values())
    span = None   # merged: the wall span of the sources, not the last one's duration
    if m.get("merged_from") and m.get("start_time") is not None and m.get("end_time") is not None:
        span = int((m["end_time"] - m["start_time"]) * 1e9)
    return {"label": label, "stages": [_stage(snap, s) for s in snap], "total": snap.total_ns,
            "processes": len(procs), "pids": [p.get("pid") for p in procs][:50], "host": m.get("host"),
            "argv": m.get("argv"), "start": m.get("start_time"), "end": m.get("end_time"),
            "duration": span if span is not None else m.get("duration_ns"),
            "tails": [v.to_dict() for v in tail(snap)]}


def render(snap: Snapshot, before: Optional[Snapshot] = None, title: Optional[str] = None,
           alpha: Optional[float] = None, min_change: Optional[float] = None) -> str:
    """The report as one HTML document; with `before`, `snap` is compared against it
    (each change tested against noise at `alpha`, `min_change`: see analysis.diff)."""
    if title is None:
        title = "instrument: before / after" if before is not None else "instrument: stage breakdown"
    snap = with_verdicts(snap)
    before = with_verdicts(before) if before is not None else None
    data: Dict[str, Any] = {"after": _side(snap, "after" if before is not None else "snapshot"),
                            "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    if any(s.ranks for s in snap):
        view = rank_view(snap)
        d = view.to_dict()
        for row, x in zip(d["stages"], view.stages):
            row["path"] = list(x.path)
        data["ranks"] = dict(d, summary=summary(view))
    if before is not None:
        data["before"] = _side(before, "before")
        opts = {k: v for k, v in (("alpha", alpha), ("min_change", min_change)) if v is not None}
        data["diff"] = _comparison(diff(before, snap, **opts))
    return (_asset("report.html").replace("%%TITLE%%", html.escape(title))
            .replace("%%CSS%%", _asset("report.css")).replace("%%JS%%", _asset("report.js"))
            .replace("%%DATA%%", embed_json(data)))


def write(path: str, snap: Snapshot, before: Optional[Snapshot] = None, title: Optional[str] = None) -> None:
    text = render(snap, before, title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
