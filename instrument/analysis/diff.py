"""Before/after comparison of two Snapshots, stage by stage (data only; the
text, markdown, CSV and JSON forms are instrument.exporters.table.render_diff).

    d = instrument.diff(Snapshot.load("before.json"), Snapshot.load("after.json"))
    d.stage, d.change            # ("request",), -0.276: 27.6 % faster per call
    d.significance.significant   # True: beyond noise (instrument.analysis.significance)

Each row says whether its change of time per call is beyond noise: from the
spread between windows when both snapshots hold several (merged snapshots),
else from a rank test on the two histograms of call times.  Counter and CPU
changes are tested only where windows give them a spread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from ..snapshot import Snapshot, StageStats, as_path
from . import significance as _sig
from .significance import Significance
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
    significance: Significance = _sig.untested("not compared")      # of the time per call
    cpu_significance: Significance = _sig.untested("not compared")  # of CPU time per call (windows only)
    counter_significance: Mapping[str, Significance] = field(default_factory=dict)   # per call (windows only)

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def significant(self) -> bool:
        return self.significance.significant

    def to_dict(self) -> Dict[str, Any]:
        """Times in ns (keys end in _ns), calls a count, intervals relative (+0.1 = 10 % more)."""
        counters = {}
        for k, c in self.counters.items():
            t = self.counter_significance.get(k)
            counters[k] = dict(c.to_dict(), significant=bool(t and t.significant),
                               interval=t.interval_list() if t else None)
        return {"path": list(self.path), "status": self.status,
                **{(k if k == "calls" else f"{k}_ns"): c.to_dict() for k, c in self.metrics.items()},
                "significant": self.significance.significant,
                "interval": self.significance.interval_list(),
                "significance": self.significance.to_dict(),
                "cpu_significance": self.cpu_significance.to_dict(),
                "counters": counters,
                "verdict": {"before": self.verdict[0], "after": self.verdict[1]}}


@dataclass(frozen=True)
class Diff:
    rows: Tuple[DiffRow, ...]
    stage: Optional[Tuple[str, ...]]   # the top-level stage the headline is about (the largest)
    change: Optional[float]            # its relative change of mean per call (+0.1 = 10 % slower)
    basis: Optional[str]               # what `change` compares: "mean" per call, "total", or None
    alpha: float = _sig.ALPHA
    min_change: float = _sig.MIN_CHANGE

    def row(self, path) -> Optional[DiffRow]:
        key = as_path(path)
        return next((r for r in self.rows if r.path == key), None)

    @property
    def significance(self) -> Significance:
        """The headline stage's test (untested when it is on one side only)."""
        top = self.row(self.stage) if self.stage else None
        return top.significance if top is not None else _sig.untested("no stage on both sides", self.alpha,
                                                                      self.min_change)

    @property
    def significant(self) -> bool:
        return self.significance.significant

    def to_dict(self) -> Dict[str, Any]:
        sig = self.significance
        return {"stage": list(self.stage) if self.stage else None, "change": self.change, "basis": self.basis,
                "significant": sig.significant, "interval": sig.interval_list(),
                "significance": sig.to_dict(), "alpha": self.alpha, "min_change": self.min_change,
                "rows": [r.to_dict() for r in self.rows]}


def _values(s: Optional[StageStats]) -> Dict[str, Optional[float]]:
    if s is None:
        return dict.fromkeys(METRICS)
    return {"calls": s.calls, "total": s.wall_total, "mean": s.wall_mean, "p50": s.quantile(0.5),
            "p99": s.quantile(0.99), "cpu": s.cpu_total}


def _windows(s: StageStats) -> list:
    return [w for w in s.all_windows() if w["calls"]]


def _in_time(ws: list) -> list:
    return sorted(ws, key=lambda w: (w.get("start_time") is None, w.get("start_time") or 0))


def _rates(ws: list, value) -> list:
    return [(w["calls"], value(w)) for w in ws]


def time_test(b: StageStats, a: StageStats, alpha: float = _sig.ALPHA,
              min_change: float = _sig.MIN_CHANGE) -> Significance:
    """The test of the typical call time: turns, windows or calls (instrument.analysis.significance)."""
    wb, wa = _windows(b), _windows(a)
    if len(wb) >= _sig.MIN_WINDOWS and len(wa) >= _sig.MIN_WINDOWS and \
            all(w.get("p50_ns") for w in wb + wa):
        pairs = _sig.turns([(w.get("start_time"), w["p50_ns"]) for w in wb],
                           [(w.get("start_time"), w["p50_ns"]) for w in wa])
        if pairs is not None:
            return _sig.paired_test([math.log(y / x) for x, y in pairs], alpha, min_change)
        return _sig.log_window_test([w["p50_ns"] for w in _in_time(wb)], [w["p50_ns"] for w in _in_time(wa)], alpha,
                                    min_change)
    return _sig.rank_test(b.hist, a.hist, alpha, min_change)


def _tests(b: StageStats, a: StageStats, alpha: float, min_change: float):
    """The tests of time, CPU time and each counter per call."""
    wb, wa = _windows(b), _windows(a)
    windowed = len(wb) >= _sig.MIN_WINDOWS and len(wa) >= _sig.MIN_WINDOWS
    time = time_test(b, a, alpha, min_change)
    none = "a side holds fewer than 3 windows: {} has no spread to test against"
    if windowed:
        cpu = _sig.window_test(_rates(wb, lambda w: w.get("cpu_ns")), _rates(wa, lambda w: w.get("cpu_ns")),
                               alpha, min_change)
    else:
        cpu = _sig.untested(none.format("CPU time"), alpha, min_change)
    counters = {}
    for n in dict.fromkeys([*b.counters, *a.counters]):
        if windowed:
            counters[n] = _sig.window_test(_rates(wb, lambda w: (w.get("counters") or {}).get(n)),
                                           _rates(wa, lambda w: (w.get("counters") or {}).get(n)), alpha, min_change)
        else:
            counters[n] = _sig.untested(none.format("a counter"), alpha, min_change)
    return time, cpu, counters


def _row(path, b: Optional[StageStats], a: Optional[StageStats], alpha: float = _sig.ALPHA,
         min_change: float = _sig.MIN_CHANGE) -> DiffRow:
    vb, va = _values(b), _values(a)
    names = list(dict.fromkeys([*(b.counters if b else ()), *(a.counters if a else ())]))
    counters = {n: Change(b.counter(n) if b else None, a.counter(n) if a else None) for n in names}
    status = "both" if a is not None and b is not None else "only before" if b is not None else "only after"
    verdict = tuple((s.verdict or {}).get("verdict") if s is not None else None for s in (b, a))
    if a is not None and b is not None:
        time, cpu, ctests = _tests(b, a, alpha, min_change)
    else:
        time = cpu = _sig.untested(f"{status}: nothing to compare", alpha, min_change)
        ctests = {}
    return DiffRow(path, status, {k: Change(vb[k], va[k]) for k in METRICS}, counters, verdict, time, cpu, ctests)


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


def check_alpha(alpha: Any) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 0.5:
        raise ValueError(f"alpha (the chance of calling noise a change) must be a number in (0, 0.5], got {alpha!r}")
    return float(alpha)


def check_min_change(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < 10:
        raise ValueError(f"min_change (the smallest relative change reported, 0.03 = 3 %) must be a number from 0 "
                         f"to 10, got {x!r}")
    return float(x)


def diff(before: Snapshot, after: Snapshot, alpha: float = _sig.ALPHA, min_change: float = _sig.MIN_CHANGE) -> Diff:
    """Per stage path of either snapshot: before, after, delta and ratio of
    calls, total, mean, p50, p99, CPU and each counter's total, and whether the
    change per call is beyond noise (its 1 - alpha interval wholly beyond
    ±min_change); rows sorted by the absolute change of total wall time."""
    alpha, min_change = check_alpha(alpha), check_min_change(min_change)
    before, after = with_verdicts(before), with_verdicts(after)
    paths = list(dict.fromkeys([*(s.path for s in before), *(s.path for s in after)]))
    rows = {p: _row(p, before.get(p), after.get(p), alpha, min_change) for p in paths}
    stage, change, basis = _headline(rows)

    def key(r: DiffRow):
        t = r.metrics["total"]
        return -abs((t.after or 0) - (t.before or 0)), r.path
    return Diff(tuple(sorted(rows.values(), key=key)), stage, change, basis, alpha, min_change)
