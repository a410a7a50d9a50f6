"""Every per-stage figure, declared once.

A Metric has a name, the unit of the number it exports, a formula over
(Snapshot, StageStats), a format kind (instrument.exporters.format turns it into
text), whether a stage's value is an estimate, and when it applies.  The
breakdown table, the HTML report, the CSV and JSON rows, `instrument top`, the
diff and the Prometheus documentation read METRICS: a new figure is one entry
here (and its test), and shows everywhere.

Formulas are ratios of sums, derived when read (as Caliper does): a stage's IPC
is its instructions over its cycles, never a mean of per-call ratios.

A value is a number, None (not measured), text (the verdict), a Bar (a value with
an error bar, shown as ±) or a dict of named components (a figure split in parts).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .. import counters as _counters
from ..snapshot import SPLIT, Z99, Snapshot, StageStats
from .tail import share_of_excess

UNITS = ("ns", "pct", "count", "ratio", "text", "bytes")   # pct: the formula gives a fraction, exported in percent
Formula = Callable[[Snapshot, StageStats], Any]


@dataclass(frozen=True)
class Bar:
    """A value with an error bar: `error` is the half-width of its interval, in the value's unit."""
    value: float
    error: float


def _always(snap: Snapshot) -> bool:
    return True


def _never(s: StageStats) -> bool:
    return False


@dataclass(frozen=True)
class Metric:
    name: str        # the sort key; with its unit, the CSV and JSON field (total -> total_ns)
    header: str      # table, HTML and top header, naming the unit of the text shown (total ms)
    unit: str        # of the exported number: one of UNITS
    kind: str        # how its text is shown: a kind of instrument.exporters.format.KINDS
    value: Formula
    doc: str
    estimated: Callable[[StageStats], bool] = _never   # the stage's value is estimated from sampled calls
    applies: Optional[Callable[[Snapshot], bool]] = None   # None: where some stage has a value
    width: int = 0          # table column width (at least the header's)
    core: bool = False      # a column of the 80-column table, before those added as the width allows
    promql: Optional[str] = None   # the same figure from the Prometheus exposition, over a window

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"metric {self.name}: unit must be one of {', '.join(UNITS)}, got {self.unit!r}")

    @property
    def field(self) -> str:
        return self.name if self.unit in ("count", "ratio", "text") else f"{self.name}_{self.unit}"

    @property
    def column_width(self) -> int:
        return max(self.width, len(self.header))

    @property
    def sortable(self) -> bool:
        return self.unit != "text"

    def wanted(self, snap: Snapshot) -> bool:
        """Whether the snapshot has this figure (a column shows at all)."""
        if self.applies is not None:
            return self.applies(snap)
        return any(self.value(snap, s) is not None for s in snap)

    def exported(self, value: Any) -> Any:
        """The value in the exported unit, as JSON holds it: a Bar as {value, error}, components as a dict."""
        scale = 100 if self.unit == "pct" else 1
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, Bar):
            return {"value": value.value * scale, "error": value.error * scale}
        if isinstance(value, Mapping):
            return {k: None if v is None else v * scale for k, v in value.items()}
        return value * scale

    def fields(self, value: Any) -> Dict[str, Any]:
        """CSV columns of one value: the field, `<field>_error` for a Bar, `<name>_<part>[_<unit>]` per component."""
        v = self.exported(value)
        if isinstance(v, dict) and isinstance(value, Bar):
            return {self.field: v["value"], f"{self.field}_error": v["error"]}
        if isinstance(v, dict):
            suffix = self.field[len(self.name):]
            return {f"{self.name}_{k}{suffix}": x for k, x in v.items()}
        return {self.field: v}


# ------------------------------------------------------------------ formulas
def _counter_ratio(key: str) -> Formula:
    """A ratio of the stage's summed counters (counters.derived), over the calls whose counters were attributed."""
    def value(snap: Snapshot, s: StageStats) -> Optional[float]:
        totals = {k: v.get("total") for k, v in s.counters.items()}
        return _counters.derived(totals, s.attributed_wall(), s.cpu_total).get(key)
    return value


def _bar(value: Optional[float], var: Optional[float]) -> Any:
    """An estimated value with its 99 % half-width (Bar); the value itself where it is exact."""
    if value is None or not var:
        return value
    return Bar(value, Z99 * math.sqrt(var))


def _counter(name: str, per_call: bool = False) -> Formula:
    def value(snap: Snapshot, s: StageStats) -> Any:
        v = s.counter(name)
        if v is None:
            return v
        var = (s.counters.get(name) or {}).get("var")
        if not per_call:
            return _bar(v, var)
        return _bar(v / s.calls, (var or 0) / s.calls ** 2) if s.calls else None
    return value


def _cpu(snap: Snapshot, s: StageStats) -> Any:
    return _bar(s.cpu_total, s.cpu_var if s.cpu_estimated else None)


def _counters_estimated(*names: str) -> Callable[[StageStats], bool]:
    return lambda s: any((s.counters.get(n) or {}).get("estimated") for n in names)


def _cpu_estimated(s: StageStats) -> bool:
    return s.cpu_estimated


def _wall_split(snap: Snapshot, s: StageStats) -> Optional[Dict[str, float]]:
    """The parts of the stage's own wall time (StageStats.wall_split) as shares of it; None where CPU time, and so
    the split, was not measured."""
    if s.cpu_self is None or not s.wall_self:
        return None
    parts = {p: s.split_part(p, self_=True) for p in SPLIT}
    return {p: v / s.wall_self for p, v in parts.items() if v}


def _memory(source: str, figure: str) -> Formula:
    """A memory source's figure per call (StageStats.memory_of): the mean peak above the call's start, as a Bar where
    it is estimated from some of the calls; the mean net change as a number (a Bar of a change near 0 would read as
    unknown).  Source "cuda": the largest over the devices' allocated bytes (cuda:N)."""
    def value(snap: Snapshot, s: StageStats) -> Any:
        srcs = [k for k in s.memory_sources if k.startswith("cuda:") and k.count(":") == 1] if source == "cuda" \
            else [source]
        figs = [f for f in (s.memory_of(k) for k in srcs) if f and f[f"{figure}_mean"] is not None]
        if not figs:
            return None
        f = max(figs, key=lambda f: f[f"{figure}_mean"])
        lo, hi = f[f"{figure}_ci99"]
        return Bar(f["peak_mean"], (hi - lo) / 2) if figure == "peak" and hi > lo else f[f"{figure}_mean"]
    return value


def _memory_estimated(source: str) -> Callable[[StageStats], bool]:
    """Whether the source's figures (for "cuda": any device's) stand for calls that were not all measured."""
    return lambda s: any((s.memory_of(k) or {}).get("calls", 0) < s.calls for k in s.memory_sources
                         if k == source or (source == "cuda" and k.startswith("cuda:")))


def _verdict(snap: Snapshot, s: StageStats) -> Optional[str]:
    return (s.verdict or {}).get("verdict")


def _events(*pairs: str) -> str:
    """PromQL: a ratio of two perf events' rates."""
    num, den = pairs
    return (f'rate(instrument_stage_perf_events_total{{event="{num}"}}[5m]) / ignoring(event) '
            f'rate(instrument_stage_perf_events_total{{event="{den}"}}[5m])')


def _per_call(event: str) -> str:
    return (f'rate(instrument_stage_perf_events_total{{event="{event}"}}[5m]) / ignoring(event) '
            'rate(instrument_stage_duration_seconds_count[5m])')


METRICS: Dict[str, Metric] = {m.name: m for m in (
    Metric("calls", "calls", "count", "int", lambda n, s: s.calls, "completed calls", applies=_always, width=6,
           core=True, promql="increase(instrument_stage_duration_seconds_count[5m])"),
    Metric("errors", "errors", "count", "int", lambda n, s: s.errors, "calls that ended by an exception",
           applies=lambda snap: any(s.errors for s in snap), width=6, core=True,
           promql="increase(instrument_stage_errors_total[5m])"),
    Metric("total", "total ms", "ns", "ms", lambda n, s: s.wall_total, "wall time of all calls", applies=_always,
           width=8, core=True, promql="increase(instrument_stage_duration_seconds_sum[5m])"),
    Metric("root", "%root", "pct", "pct", lambda n, s: n.share_of_root(s), "share of its top-level stage's wall time",
           applies=_always, core=True),
    Metric("tail", "tail%", "pct", "pct", share_of_excess,
           "share (with the stages under it) of the time its top-level stage's calls above p99 took more than a "
           "typical call (from exemplars)", core=True),
    Metric("mean", "mean ms", "ns", "ms", lambda n, s: s.wall_mean, "wall time per call", applies=_always, core=True,
           promql="rate(instrument_stage_duration_seconds_sum[5m]) / rate(instrument_stage_duration_seconds_count[5m])"),
    Metric("p50", "p50 ms", "ns", "ms", lambda n, s: s.quantile(0.5), "median wall time per call", applies=_always,
           core=True, promql="histogram_quantile(0.5, rate(instrument_stage_duration_seconds_bucket[5m]))"),
    Metric("p99", "p99 ms", "ns", "ms", lambda n, s: s.quantile(0.99), "99th percentile of wall time per call",
           applies=_always, core=True,
           promql="histogram_quantile(0.99, rate(instrument_stage_duration_seconds_bucket[5m]))"),
    Metric("self", "self ms", "ns", "ms", lambda n, s: s.wall_self, "wall time outside its child stages",
           applies=_always, core=True, promql="increase(instrument_stage_self_seconds_total[5m])"),
    Metric("cpu", "CPU ms", "ns", "ms", _cpu, "thread CPU time (estimated: ± its 99 % interval)", _cpu_estimated,
           _always,
           core=True, promql="increase(instrument_stage_cpu_seconds_total[5m])"),
    Metric("cpu_per_wall", "C/W", "ratio", "ratio", lambda n, s: s.cpu_ratio,
           "CPU time / wall time, over the calls whose CPU time was read", _cpu_estimated, _always, width=4, core=True,
           promql="rate(instrument_stage_cpu_seconds_total[5m]) / rate(instrument_stage_duration_seconds_sum[5m])"),
    Metric("sys", "sys%", "pct", "pct", lambda n, s: s.sys_share,
           "share of its own CPU time spent in the kernel (system time)", _cpu_estimated, width=5),
    Metric("ipc", "IPC", "ratio", "ratio", _counter_ratio("ipc"), "instructions per cycle",
           _counters_estimated("instructions", "cycles"), width=5, promql=_events("instructions", "cycles")),
    Metric("cache_miss", "miss%", "pct", "pct", _counter_ratio("cache_miss_ratio"), "cache misses / cache references",
           _counters_estimated("cache-misses", "cache-references"), width=6,
           promql=_events("cache-misses", "cache-references")),
    Metric("mpki", "MPKI", "ratio", "ratio1", _counter_ratio("mpki"), "cache misses per 1,000 instructions",
           _counters_estimated("cache-misses", "instructions"), width=6,
           promql="1000 * " + _events("cache-misses", "instructions")),
    Metric("branch_miss", "brmiss%", "pct", "pct", _counter_ratio("branch_miss_ratio"), "branch misses / branches",
           _counters_estimated("branch-misses", "branches"), promql=_events("branch-misses", "branches")),
    Metric("page_faults", "faults", "count", "int", _counter("page-faults"), "page faults",
           _counters_estimated("page-faults"), width=7,
           promql='increase(instrument_stage_perf_events_total{event="page-faults"}[5m])'),
    Metric("context_switches", "ctxsw", "count", "int", _counter("context-switches"), "context switches",
           _counters_estimated("context-switches"), width=6,
           promql='increase(instrument_stage_perf_events_total{event="context-switches"}[5m])'),
    Metric("page_faults_per_call", "flt/call", "ratio", "number", _counter("page-faults", per_call=True),
           "page faults per call", _counters_estimated("page-faults"), promql=_per_call("page-faults")),
    Metric("context_switches_per_call", "cs/call", "ratio", "number", _counter("context-switches", per_call=True),
           "context switches per call", _counters_estimated("context-switches"), promql=_per_call("context-switches")),
    Metric("gpu", "GPU ms", "ns", "ms", lambda n, s: (s.gpu or {}).get("total_ns"), "GPU time, from CUDA events", width=7,
           promql="increase(instrument_stage_gpu_seconds_total[5m])"),
    Metric("mem_peak", "peak MiB", "bytes", "mib", _memory("host", "peak"),
           "resident set's peak above the call's start, per call (mean; estimated: ± its 99 % interval; fresh pages "
           "the call touched, with its child stages)", _memory_estimated("host"), width=8,
           promql='instrument_stage_memory_peak_bytes{source="host"}'),
    Metric("mem_net", "net MiB", "bytes", "mib", _memory("host", "net"),
           "resident set at the call's exit less at its entry, per call (mean)", _memory_estimated("host"), width=7,
           promql='instrument_stage_memory_net_bytes{source="host"}'),
    Metric("py_peak", "py MiB", "bytes", "mib", _memory("python", "peak"),
           "traced Python heap's peak above the call's start, per call (mean; memory='python')",
           _memory_estimated("python"), width=7, promql='instrument_stage_memory_peak_bytes{source="python"}'),
    Metric("cuda_peak", "CUDA MiB", "bytes", "mib", _memory("cuda", "peak"),
           "CUDA allocator's allocated bytes' peak above the call's start, per call (mean; the largest over devices)",
           _memory_estimated("cuda"), width=8, promql='max by (stage, path) (instrument_stage_memory_peak_bytes'
                                                      '{source=~"cuda:[0-9]+"})'),
    Metric("wall_split", "split of own time %", "pct", "pct", _wall_split,
           "where the stage's own wall time went, as shares of it: on a CPU, ready in the run queue, blocked (I/O, "
           "locks, sleep), its asyncio task awaiting, woken but waiting for the event loop, not covered by a reading",
           _cpu_estimated, width=40),
    Metric("verdict", "verdict", "text", "text", _verdict, "what bounds the stage's own time (analysis.verdict)",
           width=14, core=True),
    Metric("cpu_user", "user ms", "ns", "ms", lambda n, s: s.cpu_user_total, "CPU time in user space",
           _cpu_estimated, promql='increase(instrument_stage_cpu_mode_seconds_total{mode="user"}[5m])'),
    Metric("cpu_sys", "sys ms", "ns", "ms", lambda n, s: s.cpu_sys_total, "CPU time in the kernel",
           _cpu_estimated, promql='increase(instrument_stage_cpu_mode_seconds_total{mode="system"}[5m])'),
)}


def register(metric: Metric) -> Metric:
    """Add a metric after the others (a metric of another module); its name must be new."""
    if metric.name in METRICS or metric.name in ("tree", "name"):
        raise ValueError(f"a metric named {metric.name!r} exists already (or is a sort order)")
    METRICS[metric.name] = metric
    return metric


# ------------------------------------------------------------------- reading
def sort_keys() -> Tuple[str, ...]:
    """What rows can be sorted by: tree order, name, or any metric with numbers (largest first)."""
    return ("tree", "name") + tuple(m.name for m in METRICS.values() if m.sortable)


def _descending(metric: Metric, snap: Snapshot) -> Callable[[StageStats], tuple]:
    def key(s: StageStats) -> tuple:
        v = metric.value(snap, s)
        v = v.value if isinstance(v, Bar) else v
        return (1, 0.0) if not isinstance(v, (int, float)) else (0, -v)   # no value: last
    return key


def ordered(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None) -> List[StageStats]:
    """The stages in tree order, siblings sorted by `sort` (one of sort_keys(); 'tree' keeps first-seen order);
    depth: only stages at most that deep."""
    if sort not in sort_keys():
        raise ValueError(f"sort must be one of {', '.join(sort_keys())}, got {sort!r}")
    key = None if sort == "tree" else (lambda s: s.name) if sort == "name" else _descending(METRICS[sort], snap)
    out: List[StageStats] = []

    def walk(path: Tuple[str, ...]) -> None:
        kids = snap.children(path)
        for k in kids if key is None else sorted(kids, key=key):
            if depth is None or k.depth < depth:
                out.append(k)
                walk(k.path)
    walk(())
    return out


def wanted(snap: Snapshot) -> List[Metric]:
    """The metrics the snapshot has figures for, in registry order."""
    return [m for m in METRICS.values() if m.wanted(snap)]


def row(snap: Snapshot, s: StageStats, metrics: List[Metric]) -> Dict[str, Any]:
    """One stage's figures by field, in their exported units (root_pct 84.0, cpu_per_wall 0.8)."""
    return {m.field: m.exported(m.value(snap, s)) for m in metrics}


def describe() -> str:
    """Markdown table of every metric, for docs/prometheus.md."""
    lines = ["| metric | field | shown as | meaning | PromQL |", "| --- | --- | --- | --- | --- |"]
    for m in METRICS.values():
        lines.append(f"| `{m.name}` | `{m.field}` | {m.header} | {m.doc} | "
                     f"{'`' + m.promql + '`' if m.promql else '—'} |")
    return "\n".join(lines)
