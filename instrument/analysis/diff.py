"""Before/after comparison of two Snapshots, stage by stage (data only; the
text, markdown, CSV and JSON forms are instrument.exporters.table.render_diff).

    d = instrument.diff(Snapshot.load("before.json"), Snapshot.load("after.json"))
    d.stage, d.change            # ("request",), -0.276: 27.6 % faster per call
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ..snapshot import Snapshot, StageStats
from .verdict import with_verdicts

METRICS = ("calls", "total", "mean", "p50", "p99", "cpu")


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
    stage: Optional[Tuple[str, ...]]   # the top-level stage the headline is about (the largest)
    change: Optional[float]            # its relative change of mean per call (+0.1 = 10 % slower)
    basis: Optional[str]               # what `change` compares: "mean" per call, "total", or None

    def row(self, path) -> Optional[DiffRow]:
        key = tuple(path.split("/")) if isinstance(path, str) else tuple(path)
        return next((r for r in self.rows if r.path == key), None)

    def to_dict(self) -> Dict[str, Any]:
        return {"stage": list(self.stage) if self.stage else None, "change": self.change, "basis": self.basis,
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


def _headline(rows: Dict[Tuple[str, ...], DiffRow]) -> Tuple[Optional[Tuple[str, ...]], Optional[float], Optional[str]]:
    roots = [r for p, r in rows.items() if len(p) == 1]
    if not roots:
        return None, None, None
    top = max(roots, key=lambda r: max(r.metrics["total"].before or 0, r.metrics["total"].after or 0))
    if top.status != "both":
        return top.path, None, None
    mean, tot = top.metrics["mean"], top.metrics["total"]
    if mean.ratio is None:   # no completed call on a side: compare totals
        return top.path, (tot.ratio - 1 if tot.ratio is not None else None), "total"
    return top.path, mean.ratio - 1, "mean"


def diff(before: Snapshot, after: Snapshot) -> Diff:
    """Per stage path of either snapshot: before, after, delta and ratio of
    calls, total, mean, p50, p99, CPU and each counter's total; rows sorted by
    the absolute change of total wall time."""
    before, after = with_verdicts(before), with_verdicts(after)
    paths = list(dict.fromkeys([*(s.path for s in before), *(s.path for s in after)]))
    rows = {p: _row(p, before.get(p), after.get(p)) for p in paths}
    stage, change, basis = _headline(rows)

    def key(r: DiffRow):
        t = r.metrics["total"]
        return -abs((t.after or 0) - (t.before or 0)), r.path
    return Diff(tuple(sorted(rows.values(), key=key)), stage, change, basis)
