"""Before/after comparison of two Snapshots, stage by stage (data only; the
text, markdown, CSV and JSON forms are the diff view, instrument.exporters.DIFF).

    d = instrument.diff(Snapshot.load("before.json"), Snapshot.load("after.json"))
    d.basis, d.basis_reason      # "runs", "one run a side (two plain runs): ..."
    d.machine.line               # "the machines differed: after spent 38 % of its running time waiting ..."
    r = d.row("request/model")
    r.judgement                  # "slower", "faster", "mixed", "within noise" or "untested"
    r.tests["cpu"].interval      # CPU time per call: its interval, relative (+0.1 = 10 % more)
    d.regressions(0.05)          # [(row, "cpu", test)]: slower beyond noise and by more than 5 %

Each stage is judged first on the figures per call that the machine's load does not
move: CPU time (preemption moves wall and run-queue time, not CPU time), instructions
and page faults (counted work), and items (instrument.add).  Its typical call time
(wall) is evidence only where the machines were alike (instrument.analysis.machine)
and the stage's own wait for a CPU did not change.  The tests run on one basis
(BASES: turns, windows or runs), the strongest the snapshots allow unless one is asked
for, and each at alpha / m, m the number of tests of the comparison (Bonferroni): all
intervals hold together at 1 - alpha, so identical code is called changed anywhere
with a chance of at most alpha.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..snapshot import Snapshot, StageStats, as_path, path_text
from . import machine as _machine
from . import significance as _sig
from .significance import Significance
from .verdict import with_verdicts

ROW_VALUES = ("calls", "total", "mean", "p50", "p99", "cpu")     # the values each row shows
BASES = ("turns", "windows", "runs")
WORK_COUNTERS = ("instructions", "page-faults", "minor-faults", "major-faults")   # counted work: load moves none
REGRESSIONS = ("cpu", "wall") + WORK_COUNTERS                # more of these per call is a regression (items: other work)
# One run a side: the change of CPU time per call that the stages share (their median) is taken as the machine's.
# Its members are the stages that hold no other stage (a parent's own time holds its children's enters and exits,
# the SDK's work, which moves with preemption), each measured on both sides within MEMBER_NOISE (the standard
# deviation of the log of its CPU per call, from its calls); COMMON_MIN of them, so that one changed stage is never
# their median.  The probe loop is no member: timed in short bursts after a stage exits, it ran 5 % slower beside
# a hog (up to 49 %) where the stages' median moved 1 % (benchmarks/RESULTS.md).  A stage strays from the common
# change by RELATIVE_SPREAD a run, or by what the members show where they are SPREAD_MEMBERS or more (fewer
# cannot measure a spread).  A change every member shares is the machine's on this basis: the machine line says so.
COMMON_MIN = 3
MEMORY_FLOOR = 1 << 20   # a memory peak per call judged by diff: from 1 MiB (below, the allocator's reuse rules it)
PAGE_BYTES = 4096        # a peak's resolution: one page
SPREAD_MEMBERS = 5
MEMBER_NOISE = 0.02


def metric_text(metric: str) -> str:
    """`cpu` → "CPU per call", `wall` → "typical call", `page-faults` → "page-faults per call", `item:tokens` →
    "tokens per call"."""
    if metric == "cpu":
        return "CPU per call"
    if metric == "wall":
        return "typical call"
    if metric.startswith("mem:"):
        return f"{metric[4:]} memory peak per call"
    return f"{metric[5:] if metric.startswith('item:') else metric} per call"


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
    metrics: Mapping[str, Change]     # ROW_VALUES, in ns (calls: a count)
    counters: Mapping[str, Change]    # each counter's total
    verdict: Tuple[Optional[str], Optional[str]] = (None, None)   # bottleneck verdict before, after
    tests: Mapping[str, Significance] = field(default_factory=dict)   # per figure: "cpu", "wall", counters, "item:…"
    not_evidence: Mapping[str, str] = field(default_factory=dict)     # figures that do not judge the stage, and why

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def judged(self) -> List[Tuple[str, Significance]]:
        """The tests that judge the stage (evidence), in the order they are read: CPU first, wall last."""
        return [(k, t) for k, t in self.tests.items() if k not in self.not_evidence and t.basis != "none"]

    @property
    def judgement(self) -> str:
        """slower, faster, mixed (some figures more, some less), within noise, or untested."""
        return self.judgement_of()

    def judgement_of(self, figures: Optional[Tuple[str, ...]] = None) -> str:
        """The judgement of the stage by the given figures only (e.g. ("cpu", "wall"): its time), else by all."""
        judged = [(k, t) for k, t in self.judged if figures is None or k in figures]
        if not judged:
            return "untested"
        ways = {t.direction for _, t in judged} - {0}
        return "mixed" if len(ways) == 2 else {1: "slower", -1: "faster"}.get(next(iter(ways), 0), "within noise")

    @property
    def decision(self) -> Tuple[Optional[str], Significance]:
        """(figure, test) that decides the stage's judgement: the first significant judged test, else the first
        judged one, else the typical call's (not evidence), else an untested one."""
        judged = self.judged
        first = next(((k, t) for k, t in judged if t.significant), judged[0] if judged else None)
        if first is not None:
            return first
        if "wall" in self.tests:
            return "wall", self.tests["wall"]
        return None, _sig.untested(f"{self.status}: nothing to compare" if self.status != "both"
                                   else "no calls on a side")

    @property
    def significance(self) -> Significance:
        return self.decision[1]

    @property
    def significant(self) -> bool:
        return any(t.significant for _, t in self.judged)

    @property
    def detectable(self) -> Optional[float]:
        """The smallest rise that every judged figure per call of the stage would have flagged (the largest of
        their tests' `detectable`); None where none is judged."""
        found = [t.detectable for k, t in self.judged if k in REGRESSIONS and t.detectable is not None]
        return max(found) if found else None

    def to_dict(self) -> Dict[str, Any]:
        """Times in ns (keys end in _ns), calls a count, intervals relative (+0.1 = 10 % more)."""
        return {"path": list(self.path), "status": self.status,
                **{(k if k == "calls" else f"{k}_ns"): c.to_dict() for k, c in self.metrics.items()},
                "judgement": self.judgement, "significant": self.significant, "detectable": _finite(self.detectable),
                "interval": self.significance.interval_list(), "significance": self.significance.to_dict(),
                "tests": {k: dict(t.to_dict(), figure=metric_text(k), beyond_noise=t.significant,
                                  significant=t.significant and k not in self.not_evidence,
                                  evidence=k not in self.not_evidence, not_evidence=self.not_evidence.get(k))
                          for k, t in self.tests.items()},
                "counters": {k: c.to_dict() for k, c in self.counters.items()},
                "verdict": {"before": self.verdict[0], "after": self.verdict[1]}}


@dataclass(frozen=True)
class Diff:
    rows: Tuple[DiffRow, ...]
    stage: Optional[Tuple[str, ...]]   # the top-level stage the headline is about (the largest)
    change: Optional[float]            # its relative change of mean per call (+0.1 = 10 % slower)
    change_of: Optional[str]           # what `change` compares: "mean" per call, "total", or None
    basis: str                         # BASES: what every test compared
    basis_reason: str                  # why that basis, and what it means
    machine: _machine.Comparison
    alpha: float = _sig.ALPHA          # the chance of calling identical code changed anywhere
    min_change: float = _sig.MIN_CHANGE
    tests: int = 0                     # m: each test ran at alpha / m
    requested_basis: Optional[str] = None
    warnings: Tuple[str, ...] = ()
    reference: Optional[Tuple[str, ...]] = None   # the stage whose change of time is taken as the machine's

    def row(self, path) -> Optional[DiffRow]:
        key = as_path(path)
        return next((r for r in self.rows if r.path == key), None)

    @property
    def significance(self) -> Significance:
        """The headline stage's deciding test (untested when it is on one side only)."""
        top = self.row(self.stage) if self.stage else None
        return top.significance if top is not None else _sig.untested("no stage on both sides", self.alpha,
                                                                      self.min_change)

    @property
    def significant(self) -> bool:
        return self.significance.significant

    def regressions(self, pct: float = 0.0) -> List[Tuple[DiffRow, str, Significance]]:
        """(row, figure, test) of every judged figure per call that grew beyond noise by more than `pct` (0.05: 5 %)."""
        return [(r, k, t) for r in self.rows for k, t in r.judged
                if k in REGRESSIONS and t.direction > 0 and t.estimate is not None and round(t.estimate, 12) > pct]

    def blind(self, pct: float = 0.0) -> List[Tuple[DiffRow, str, Significance]]:
        """(row, figure, test) of every judged figure per call that could not have shown a rise of `pct` (0.1: 10 %):
        the smallest rise its test flags (`detectable`) is larger."""
        return [(r, k, t) for r in self.rows for k, t in r.judged
                if k in REGRESSIONS and t.detectable is not None and round(t.detectable, 12) > pct]

    def to_dict(self) -> Dict[str, Any]:
        sig = self.significance
        return {"stage": list(self.stage) if self.stage else None, "change": self.change, "change_of": self.change_of,
                "basis": self.basis, "basis_reason": self.basis_reason, "requested_basis": self.requested_basis,
                "reference": list(self.reference) if self.reference else None,
                "warnings": list(self.warnings), "machine": self.machine.to_dict(),
                "significant": sig.significant, "interval": sig.interval_list(), "significance": sig.to_dict(),
                "alpha": self.alpha, "tests": self.tests, "level": 1 - self.alpha / max(self.tests, 1),
                "min_change": self.min_change, "rows": [r.to_dict() for r in self.rows]}


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None


# ------------------------------------------------------------------ runs and their windows
def _span(w: Mapping[str, Any]) -> Optional[Tuple[float, float]]:
    s, e = w.get("start_time"), w.get("end_time")
    return (s, e) if isinstance(s, (int, float)) and isinstance(e, (int, float)) else None


def _join(ws: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Windows recorded at the same time (processes of one run) as one window: sums added, the median the largest's."""
    big = max(ws, key=lambda w: w["calls"])

    def total(get: Callable[[Mapping[str, Any]], Any]) -> Any:
        vals = [get(w) for w in ws]
        return None if any(v is None for v in vals) else sum(vals)
    counters = set().union(*(w.get("counters") or {} for w in ws))
    items = set().union(*(w.get("items") or {} for w in ws))
    spans = [_span(w) for w in ws]
    return {"calls": sum(w["calls"] for w in ws), "wall_ns": sum(w["wall_ns"] for w in ws),
            "p50_ns": big.get("p50_ns"), "cpu_ns": total(lambda w: w.get("cpu_ns")),
            "counters": {n: total(lambda w: (w.get("counters") or {}).get(n)) for n in counters},
            "items": {n: sum((w.get("items") or {}).get(n, 0) for w in ws) for n in items},
            "start_time": min(s for s, _ in spans) if all(spans) else None,
            "end_time": max(e for _, e in spans) if all(spans) else None}


def _groups(windows: Sequence[Mapping[str, Any]]) -> List[List[Mapping[str, Any]]]:
    """Windows in time order, grouped where they overlap in time (processes recorded together: one run)."""
    out: List[List[Mapping[str, Any]]] = []
    for w in sorted((w for w in windows if _span(w)), key=lambda w: _span(w)):
        if out and _span(w)[0] < max(_span(x)[1] for x in out[-1]):
            out[-1].append(w)
        else:
            out.append([w])
    return out + [[w] for w in windows if not _span(w)]


def runs_of(windows: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """A stage's windows as runs: in time order, those recorded together joined."""
    return [_join(g) if len(g) > 1 else dict(g[0]) for g in _groups(windows)]


def _runs(snap: Snapshot) -> Tuple[List[Optional[float]], bool]:
    """The start time of each run a snapshot holds (its sources, those recorded together as one), and whether
    they are separate runs: no process (pid and host) records in two of them.  Windows of one recording (a
    service's snapshots taken now and then) share their process."""
    meta = snap.meta
    sources = [s for s in (meta.get("merged_from") or [meta]) if isinstance(s, Mapping)]
    groups = _groups(sources)
    procs = [{(s.get("pid"), s.get("host")) for s in g} for g in groups]
    separate = all(None not in {p for p, _ in ps} for ps in procs) and \
        sum(len(ps) for ps in procs) == len(set().union(*procs))
    return [min(_span(w)[0] for w in g) if _span(g[0]) else None for g in groups], separate


def choose_basis(before: Snapshot, after: Snapshot, requested: Optional[str] = None,
                 common: Optional[_machine.Common] = None) -> Tuple[str, str, List[str]]:
    """(basis, why, warnings): the basis asked for where it holds, else the strongest the snapshots allow.
    `common`: the change the stages share (with several runs a side, per run), which CPU time is judged against."""
    if requested is not None and requested not in BASES:
        raise ValueError(f"basis must be one of {', '.join(BASES)}, got {requested!r}")
    (rb, sb), (ra, sa) = _runs(before), _runs(after)
    kb, ka = len(rb), len(ra)
    pairs = _sig.turns([(t, t) for t in rb], [(t, t) for t in ra])
    holds = {"turns": pairs is not None, "windows": min(kb, ka) >= _sig.MIN_WINDOWS, "runs": True}
    # separate runs, two or more a side: their spread measures what separates processes of the same code (their
    # layout in memory, the machine's drift between them), which the windows' drift between halves counts twice
    measured = sb and sa and min(kb, ka) >= 2
    why = {
        "turns": f"the {kb} and {ka} windows of the two sides alternate in time: each is compared with its neighbour "
                 f"of the other side ({len(pairs or ())} pairs), so the machine's drift falls on both and cancels",
        "windows": f"each side holds {_sig.MIN_WINDOWS}+ windows ({kb} and {ka}) not taken in turns: Welch's test "
                   "on the windows, each side's drift between its halves standing in for the drift between the sides",
        "runs": ("one run a side (two plain runs): each figure per call with its spread over its run; the spread "
                 "between runs is not measured: "
                 + (f"CPU time per call is judged against the change the stages share ({common.text()}), each "
                    f"stage straying from it by ±{100 * _strays(common):.0f} % a run; for wall time, "
                    if common is not None else "for time, ")
                 + "how far a machine's speed strays over a run of T seconds and between runs stands in for it "
                 f"({_sig.MACHINE_SPREAD:g} × √({_sig.MACHINE_MEMORY_S:g} s / T) and {_sig.MACHINE_DRIFT:g} on the "
                 "log scale); a reference stage takes the machine out, and several runs a side, each a process of "
                 "its own, measure the spread"
                 if kb == ka == 1 else
                 f"{kb} run{'s' if kb != 1 else ''} before, {ka} after"
                 f"{', each a process of its own' if sb and sa else ''}: the spread between runs measured from "
                 "them (a pooled t-test)"
                 + (f"; CPU time per call is judged in each run against the change the stages share in that run "
                    f"({common.text()}), each stage straying from it by at least ±{100 * _strays(common):.0f} % a run, "
                    f"the spread between runs of those {len(common.members)} stages pooled over them"
                    if common is not None and common.runs else "")),
    }
    cannot = {
        "turns": f"the windows do not alternate in time ({len(pairs or ())} of {max(kb, ka)} make turns; "
                 f"{_sig.MIN_TURNS}+ pairs taking in 80 % of each side are needed)",
        "windows": f"a side holds fewer than {_sig.MIN_WINDOWS} windows ({kb} before, {ka} after)",
    }
    strongest = "turns" if holds["turns"] else "runs" if measured else next(b for b in BASES if holds[b])
    if requested is None:
        return strongest, f"{strongest}, the strongest these snapshots allow: {why[strongest]}", []
    if holds[requested]:
        return requested, f"{requested}, as asked: {why[requested]}", []
    warning = f"basis {requested} cannot hold: {cannot[requested]}; judged on {strongest} instead"
    return strongest, f"{strongest} (asked for {requested}, which cannot hold): {why[strongest]}", [warning]


# ------------------------------------------------------------------ figures per call
def _per_call(get: Callable[[Mapping[str, Any]], Any], count: bool) -> Callable[[Mapping[str, Any]], Optional[float]]:
    """A window's figure per call; a count of 0 is taken as half a count, so its log is defined."""
    def figure(w: Mapping[str, Any]) -> Optional[float]:
        v, calls = get(w), w.get("calls")
        if v is None or not calls:
            return None
        return (v if v > 0 else 0.5) / calls if count else (v / calls if v > 0 else None)
    return figure


def figure_of(metric: str) -> Callable[[Mapping[str, Any]], Optional[float]]:
    """The window's value of a figure: its median call (wall), or a sum per call."""
    if metric == "wall":
        return lambda w: w.get("p50_ns") or None
    if metric == "cpu":
        return _per_call(lambda w: w.get("cpu_ns"), False)
    if metric.startswith("item:"):
        return _per_call(lambda w: (w.get("items") or {}).get(metric[5:]), True)
    if metric.startswith("mem:"):   # the mean peak above a call's start (a mean already, not a sum)
        def peak(w: Mapping[str, Any]) -> Optional[float]:
            m = (w.get("memory") or {}).get(metric[4:])
            return max(m["w_peak"] / m["w"], PAGE_BYTES / 2) if m and m["w"] > 0 else None   # 0: half a page
        return peak
    return _per_call(lambda w: (w.get("counters") or {}).get(metric), True)


def spread(s: StageStats) -> float:
    """The calls' spread: the standard deviation of log call time a normal distribution has for the stage's
    quartiles."""
    q1, q3 = s.quantile(0.25), s.quantile(0.75)
    return math.log(q3 / q1) / 1.349 if q1 and q3 and q3 > q1 else 0.0


def run_variance(s: StageStats, metric: str, machine: float) -> float:
    """The variance of the log of one run's figure per call: the calls' spread over their number, the estimate's
    own variance where it was sampled, and for time the machine's part, `machine` (for wall time, on its share on a
    CPU); counts (counters, items) add their Poisson variance."""
    n = max(s.calls, 1)
    calls = spread(s) ** 2 / n
    if metric == "wall":   # the machine's speed moves the part of a typical call on a CPU (sleep keeps its length)
        return machine * on_cpu_share(s) ** 2 + calls * math.pi / 2          # a median's variance, as a mean's
    if metric == "cpu":
        return machine + calls + (s.cpu_var / s.cpu_total ** 2 if s.cpu_total else 0.0)
    if metric.startswith("item:"):
        return calls + 1 / ((s.item_total(metric[5:]) or 0) + 0.5)
    if metric.startswith("mem:"):   # the mean of the calls measured: their spread over their number
        m = (s.memory or {}).get(metric[4:]) or {}
        n, mean = m.get("calls") or 0, (m.get("peak_sum") or 0) / max(m.get("calls") or 1, 1)
        if n < 2 or mean <= 0:
            return math.inf
        return max(m["peak_sq"] / n - mean ** 2, 0.0) / (n - 1) / mean ** 2 + (PAGE_BYTES / mean) ** 2 / n
    c = s.counters.get(metric) or {}
    total = (c.get("total") or 0) + 0.5
    return calls + (c.get("var") or 0) / total ** 2 + 1 / total


def _leaf_changes(before: Snapshot, after: Snapshot, noise: float = math.inf) -> List[Tuple[str, float]]:
    """(path text, log change of CPU time per call) of each stage that holds no other, with CPU time on both sides
    measured within `noise` (the standard deviation of its log over the run)."""
    parents = {s.path[:-1] for snap in (before, after) for s in snap}

    def member(s: Optional[StageStats]) -> bool:
        return s is not None and (s.cpu_total or 0) > 0 and bool(s.cpu_calls) and \
            run_variance(s, "cpu", 0.0) <= noise ** 2
    return [(path_text(b.path), math.log((a.cpu_total / a.cpu_calls) / (b.cpu_total / b.cpu_calls)))
            for b, a in ((b, after.get(b.path)) for b in before)
            if b.path not in parents and member(b) and member(a)]


def common_change(before: Snapshot, after: Snapshot) -> Optional[_machine.Common]:
    """The change of CPU time per call that the stages share: the median of the members' log changes (each stage
    that holds no other, its CPU time per call well measured on both sides); None with fewer than COMMON_MIN."""
    members = _leaf_changes(before, after, MEMBER_NOISE)
    if len(members) < COMMON_MIN:
        return None
    changes = [c for _, c in members]
    mid = statistics.median(changes)
    mad = statistics.median(abs(c - mid) for c in changes)
    return _machine.Common(mid, tuple(m for m, _ in members), tuple(changes), 1.4826 * mad)


def _run_logs(s: Optional[StageStats]) -> Dict[Tuple[float, float], float]:
    """(start, end) → log of CPU time per call, of each run of the stage with CPU time and a time span."""
    cpu = figure_of("cpu")
    runs = [(_span(w), cpu(w)) for w in runs_of(s.all_windows())] if s is not None else []
    return {span: math.log(x) for span, x in runs if span is not None and x}


def common_runs(before: Snapshot, after: Snapshot) -> Optional[_machine.Common]:
    """Several runs a side: the change of CPU time per call the stages share in each run.  A run's level is the
    median, over the members (as common_change's) that ran in it, of their log CPU time per call less their mean
    over the runs before; a run with fewer than COMMON_MIN members has none.  `change` is the mean level after less
    the mean level before.  None with fewer than COMMON_MIN members, or a side with no level."""
    members = [m for m, _ in _leaf_changes(before, after, MEMBER_NOISE)]
    if len(members) < COMMON_MIN:
        return None
    logs = {m: (_run_logs(before.get(m)), _run_logs(after.get(m))) for m in members}
    base = {m: statistics.mean(logs[m][0].values()) for m in members if logs[m][0]}
    levels: List[Dict[Tuple[float, float], float]] = [{}, {}]
    for side in (0, 1):
        for span in sorted({span for m in base for span in logs[m][side]}):
            devs = [logs[m][side][span] - base[m] for m in base if span in logs[m][side]]
            if len(devs) >= COMMON_MIN:
                levels[side][span] = statistics.median(devs)
    if not levels[0] or not levels[1]:
        return None
    members = [m for m in base if logs[m][1]]
    changes = [statistics.mean(logs[m][1].values()) - base[m] for m in members]
    mid = statistics.median(changes)
    ss, df = 0.0, 0
    for m in members:   # each member's spread between runs, less the levels: pooled over them
        sides = [[x - lv[span] for span, x in lg.items() if span in lv] for lg, lv in zip(logs[m], levels)]
        if all(sides) and sum(map(len, sides)) > 2:
            ss += sum(sum((v - statistics.mean(x)) ** 2 for v in x) for x in sides)
            df += sum(map(len, sides)) - 2
    return _machine.Common(statistics.mean(levels[1].values()) - statistics.mean(levels[0].values()), tuple(members),
                           tuple(changes), 1.4826 * statistics.median(abs(c - mid) for c in changes),
                           tuple((s, e, c) for lv in levels for (s, e), c in lv.items()), (ss, df))


def _level(common: _machine.Common, w: Mapping[str, Any]) -> Optional[float]:
    """The common level of the run a window (a run of a stage) fell in: the one whose time span it overlaps."""
    span = _span(w)
    if span is None:
        return None
    return next((c for s, e, c in common.runs if s < span[1] and span[0] < e or (s, e) == span), None)


def _strays(common: _machine.Common) -> float:
    """How far a stage's CPU per call strays from the common change in one run (the log's standard deviation):
    RELATIVE_SPREAD, or the members' spread where they are enough to show it (their spread is of a pair of runs)."""
    shown = common.spread / math.sqrt(2) if len(common.members) >= SPREAD_MEMBERS else 0.0
    return max(_sig.RELATIVE_SPREAD, shown)


def on_cpu_share(s: StageStats) -> float:
    """The share of the stage's running time not spent waiting for a CPU that it spent on one (1 where unknown)."""
    if s.cpu_total is None or not s.covered_run:
        return 1.0
    ready = s.covered_run - (s.runqueue["total"] if s.runqueue is not None else 0)
    return min(1.0, s.cpu_total / ready) if ready > 0 else 1.0


def _seconds(snap: Snapshot) -> Optional[float]:
    """How long the snapshot's recording lasted (a merge: from its first source's start to its last one's end)."""
    m = snap.meta
    s = _span(m)
    if m.get("merged_from") or not isinstance(m.get("duration_ns"), (int, float)):
        return s[1] - s[0] if s else None
    return m["duration_ns"] / 1e9


def _figures(b: StageStats, a: StageStats) -> List[str]:
    """The figures both sides have: CPU, counted work, items, wall."""
    out = ["cpu"] if b.cpu_total and a.cpu_total and b.cpu_calls and a.cpu_calls else []
    out += [n for n in WORK_COUNTERS if b.counter(n) is not None and a.counter(n) is not None
            and (b.counter(n) or a.counter(n))]
    out += [f"item:{n}" for n in b.items if n in a.items]
    out += [f"mem:{src}" for src in b.memory_sources if src in a.memory_sources
            and min((s.memory_of(src) or {}).get("calls") or 0 for s in (b, a)) >= 2
            and max((s.memory_of(src) or {}).get("peak_mean") or 0 for s in (b, a)) >= MEMORY_FLOOR]
    return out + ["wall"]


@dataclass(frozen=True)
class _Plan:
    """How the tests of one comparison run: its basis, the seconds each side's run lasted, the reference stage
    (before, after) whose time figures stand for the machine's, the floor of time figures."""
    basis: str
    seconds: Tuple[Optional[float], Optional[float]]
    reference: Optional[Tuple[StageStats, StageStats]]
    time_floor: float
    common: Optional[_machine.Common] = None   # the runs basis: CPU time judged against it (per run where several)


def _relative(figure: Callable[[Mapping[str, Any]], Optional[float]], ref: StageStats):
    """A window's figure over the reference stage's in the same window (matched by start time)."""
    by_start = {w.get("start_time"): w for w in runs_of(ref.all_windows())}

    def rel(w: Mapping[str, Any]) -> Optional[float]:
        x, r = figure(w), by_start.get(w.get("start_time"))
        y = figure(r) if r is not None else None
        return x / y if x and y else None
    return rel


def _test(plan: _Plan, metric: str, b: StageStats, a: StageStats, alpha: float, min_change: float) -> Significance:
    figure = figure_of(metric)
    time = metric in ("cpu", "wall")
    rb, ra = runs_of(b.all_windows()), runs_of(a.all_windows())
    common = plan.common if metric == "cpu" else None
    floor = max(min_change, plan.time_floor) if time and common is None else min_change
    if not time and len({figure(w) for w in rb + ra}) == 1:   # counted work that never moved
        return _sig.untested(f"{metric_text(metric)} the same in every window of both sides", alpha, floor)
    relative = time and plan.reference is not None and b.path != plan.reference[0].path
    fb, fa = (_relative(figure, plan.reference[0]), _relative(figure, plan.reference[1])) if relative else (figure,) * 2
    if plan.basis == "turns":
        pairs = _sig.turns([(w.get("start_time"), w) for w in rb], [(w.get("start_time"), w) for w in ra])
        if pairs is None:
            return _sig.untested(f"this stage's windows do not take turns ({len(rb)} and {len(ra)})", alpha, floor)
        logs = [math.log(y / x) for x, y in ((fb(p), fa(q)) for p, q in pairs) if x and y]
        return _sig.paired_test(logs, alpha, floor)
    if plan.basis == "windows":
        return _sig.log_window_test([fb(w) for w in rb], [fa(w) for w in ra], alpha, floor)
    if len(rb) == len(ra) == 1:
        if common is not None:   # what is left is how far the stage strayed from the others, process to process
            rel = _strays(common) ** 2
            x, y = fb(rb[0]), fa(ra[0])
            vb, va = run_variance(b, metric, rel), run_variance(a, metric, rel)
            return _with_calls(_sig.runs_test([(x, vb)], [(y and y / math.exp(common.change), va)], alpha, floor),
                               b, a, metric, vb + va)
        if relative:   # the reference shares the machine: what is left is how differently the two respond to it
            vb = run_variance(b, metric, _sig.RELATIVE_SPREAD ** 2) + run_variance(plan.reference[0], metric, 0.0)
            va = run_variance(a, metric, _sig.RELATIVE_SPREAD ** 2) + run_variance(plan.reference[1], metric, 0.0)
            return _with_calls(_sig.runs_test([(fb(rb[0]), vb)], [(fa(ra[0]), va)], alpha, floor), b, a, metric,
                               vb + va)
        vb = run_variance(b, metric, _sig.machine_variance(plan.seconds[0]) if time else 0.0)
        va = run_variance(a, metric, _sig.machine_variance(plan.seconds[1]) if time else 0.0)
        # the machine's wander averages out over a longer run (more calls); its drift between runs does not
        fast = sum(_sig.machine_variance(t) - _sig.MACHINE_DRIFT ** 2 for t in plan.seconds) if time else 0.0
        return _with_calls(_sig.runs_test([(fb(rb[0]), vb)], [(fa(ra[0]), va)], alpha, floor), b, a, metric,
                           vb + va, fast)
    if common is not None and common.runs:   # each run's figure over the level the stages share in that run
        def level(f: Callable[[Mapping[str, Any]], Optional[float]]) -> Callable[[Mapping[str, Any]], Optional[float]]:
            def rel(w: Mapping[str, Any]) -> Optional[float]:
                x, c = f(w), _level(common, w)
                return x / math.exp(c) if x and c is not None else None
            return rel
        fb, fa = level(fb), level(fa)
        member = path_text(b.path) in common.members   # its spread between runs estimated with the others'
        return _sig.runs_test([(fb(w), 0.0) for w in rb], [(fa(w), 0.0) for w in ra], alpha, floor,
                              stray=_strays(common) ** 2, pooled=common.pooled if member else None)
    return _sig.runs_test([(fb(w), 0.0) for w in rb], [(fa(w), 0.0) for w in ra], alpha, floor)


def _with_calls(t: Significance, b: StageStats, a: StageStats, metric: str, variance: float,
                machine: float = 0.0) -> Significance:
    """The test with the share of its variance that more calls would shrink: the calls' spread over their number,
    and `machine`, the part of the machine's variance a longer run averages out."""
    calls = machine + sum(spread(s) ** 2 / max(s.calls, 1) * (math.pi / 2 if metric == "wall" else 1) for s in (b, a))
    return replace(t, calls_share=min(1.0, calls / variance)) if variance > 0 and t.basis != "none" else t


def _mean(total: Optional[float], calls: int) -> Optional[float]:
    return None if total is None or not calls else total / calls


def _not_evidence(b: StageStats, a: StageStats, machine: _machine.Comparison) -> Optional[str]:
    """Why the stage's wall time is no evidence of its own change, or None where it is.  Where the machines (or
    this stage's wait for a CPU) differed, only the wall time of a stage off the CPU most of its time (sleeping,
    waiting for I/O, a lock, a device: what CPU time does not see) is evidence, and only where the machine explains
    less than half of its change per call: the change of its time waiting for a CPU, and the machine's change of
    speed on its CPU time.  A change of its wait for the GIL is one of waiting too (other threads' Python), not of
    its own code: it is explained like the wait for a CPU."""
    wb, wa = _machine.waiting(b), _machine.waiting(a)
    own = wb is not None and wa is not None and abs(wa - wb) > _machine.WAITING_POINTS
    gb, ga = _gil_waiting(b), _gil_waiting(a)
    gil = gb is not None and ga is not None and abs(ga - gb) > _machine.WAITING_POINTS
    if not machine.differed and not own and not gil:
        return None
    why = "the machines differed" if machine.differed else \
        f"it waited for a CPU {100 * wb:.0f} % → {100 * wa:.0f} % of its running time" if own else \
        f"it waited for the GIL {100 * gb:.0f} % → {100 * ga:.0f} % of its running time"
    if b.runqueue is None or a.runqueue is None:
        return why                         # the machine's part cannot be told: none of the change is evidence
    busy = max(((s.cpu_total or 0) + s.runqueue["total"]) / s.covered_run if s.covered_run else 1.0 for s in (b, a))
    if busy > 0.5:
        return f"{why}; on a CPU or waiting for one {100 * min(busy, 1):.0f} % of its time: CPU time judges it"
    change = a.wall_mean - b.wall_mean
    waiting = _mean(a.runqueue["total"], a.cpu_calls) - _mean(b.runqueue["total"], b.cpu_calls)
    gil_wait = (_mean(a.split_part("gil"), a.cpu_calls) or 0.0) - (_mean(b.split_part("gil"), b.cpu_calls) or 0.0)
    speed = (machine.speed_change or 0.0) * (_mean(b.cpu_total, b.cpu_calls) or 0.0)
    explained = waiting + gil_wait + speed
    if abs(change - explained) > abs(explained):
        return None
    return f"{why}; waiting for a CPU {_signed_us(waiting)}" + \
        (f", for the GIL {_signed_us(gil_wait)}" if gb is not None and ga is not None else "") + \
        f" and the machine's speed {_signed_us(speed)} of its {_signed_us(change)} per call"


def _gil_waiting(s: StageStats) -> Optional[float]:
    """Share of the stage's running time it spent waiting for the GIL; None where not measured."""
    gil = s.split_part("gil")
    return None if gil is None or not s.covered_run else min(1.0, gil / s.covered_run)


def _signed_us(ns: float) -> str:
    x = abs(ns)
    return ("+" if ns >= 0 else "−") + (f"{x / 1e6:.3g} ms" if x >= 1e6 else f"{x / 1e3:.3g} µs")


def _values(s: Optional[StageStats]) -> Dict[str, Optional[float]]:
    if s is None:
        return dict.fromkeys(ROW_VALUES)
    return {"calls": s.calls, "total": s.wall_total, "mean": s.wall_mean, "p50": s.quantile(0.5),
            "p99": s.quantile(0.99), "cpu": s.cpu_total}


def _row(path, b: Optional[StageStats], a: Optional[StageStats], tests: Mapping[str, Significance],
         not_evidence: Mapping[str, str]) -> DiffRow:
    vb, va = _values(b), _values(a)
    names = list(dict.fromkeys([*(b.counters if b else ()), *(a.counters if a else ())]))
    counters = {n: Change(b.counter(n) if b else None, a.counter(n) if a else None) for n in names}
    status = "both" if a is not None and b is not None else "only before" if b is not None else "only after"
    verdict = tuple((s.verdict or {}).get("verdict") if s is not None else None for s in (b, a))
    return DiffRow(path, status, {k: Change(vb[k], va[k]) for k in ROW_VALUES}, counters, verdict, tests, not_evidence)


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


def _reference(before: Snapshot, after: Snapshot, path: Any) -> Tuple[StageStats, StageStats]:
    key = as_path(path)
    sides = before.get(key), after.get(key)
    if any(s is None or not s.calls or not s.cpu_total for s in sides):
        raise ValueError(f"reference stage {'/'.join(key)!r} needs calls and CPU time in both snapshots; a stage "
                         "whose code did not change, recorded in the same calls as the others")
    return sides[0], sides[1]


def diff(before: Snapshot, after: Snapshot, alpha: float = _sig.ALPHA, min_change: float = _sig.MIN_CHANGE,
         basis: Optional[str] = None, reference: Optional[Any] = None) -> Diff:
    """Per stage path of either snapshot: before, after, delta and ratio of calls, total, mean, p50, p99, CPU and
    each counter's total, and each figure per call tested against noise on `basis` (None: the strongest the
    snapshots allow); rows sorted by the absolute change of total wall time.  `reference`: a stage whose code did
    not change, recorded in the same calls as the others: its change of time is taken as the machine's, and every
    other stage's time is judged relative to it."""
    alpha, min_change = check_alpha(alpha), check_min_change(min_change)
    requested = basis
    one_run = len(_runs(before)[0]) == len(_runs(after)[0]) == 1     # the runs basis, the only one that holds
    common = None
    if reference is None and one_run:
        common = common_change(before, after)
    elif reference is None and choose_basis(before, after, requested)[0] == "runs":
        common = common_runs(before, after)
    basis, why, warnings = choose_basis(before, after, requested, common)
    before, after = with_verdicts(before), with_verdicts(after)
    ref = _reference(before, after, reference) if reference is not None else None
    machine = _machine.compare(before, after, ref, common)
    # on the runs basis a time figure's change within the machine's own change of speed is not claimed
    speed = abs(machine.speed_change or 0.0) if basis == "runs" and ref is None else 0.0
    if speed > min_change and common is None:   # a loop's change that sets a floor: only the part the stages share
        leaves = [c for _, c in _leaf_changes(before, after)]
        if leaves:
            machine = _machine.compare(before, after, ref, common, statistics.median(leaves))
            speed = abs(machine.speed_change or 0.0)
    plan = _Plan(basis, (_seconds(before), _seconds(after)), ref, speed, common)
    paths = list(dict.fromkeys([*(s.path for s in before), *(s.path for s in after)]))
    plans: Dict[Tuple[str, ...], Tuple[List[str], Dict[str, str]]] = {}
    for p in paths:
        b, a = before.get(p), after.get(p)
        if b is not None and a is not None and b.calls and a.calls:
            if ref is not None and p == ref[0].path:
                out = dict.fromkeys(("cpu", "wall"), "the reference: its change is taken as the machine's")
            else:
                wall = _not_evidence(b, a, machine)
                out = {"wall": wall} if wall else {}
            plans[p] = _figures(b, a), out
    m = sum(1 for p, (figures, out) in plans.items() for k in figures
            if k not in out and _test(plan, k, before[p], after[p], alpha, min_change).basis != "none")
    level = alpha / max(m, 1)
    rows = {}
    for p in paths:
        b, a = before.get(p), after.get(p)
        figures, out = plans.get(p, ((), {}))
        rows[p] = _row(p, b, a, {k: _test(plan, k, b, a, level, min_change) for k in figures}, out)
    stage, change, change_of = _headline(rows)

    def key(r: DiffRow):
        t = r.metrics["total"]
        return -abs((t.after or 0) - (t.before or 0)), r.path
    return Diff(tuple(sorted(rows.values(), key=key)), stage, change, change_of, basis, why, machine, alpha,
                min_change, m, requested, tuple(warnings), ref[0].path if ref else None)
