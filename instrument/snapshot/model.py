"""The Snapshot: the one data model.

An immutable tree of per-stage statistics (StageStats) plus `meta`.  Reports, diff, merge, every exporter and the
CLI read Snapshots; none of them touches the live collector, so a saved file can do everything a live snapshot
can.  The file format is schema.py's, the merge and window rules merge.py's; the classes here call them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from .. import histogram as _hist
from . import merge as _merge
from . import schema as _schema
from .base import Z99, SnapshotError, as_path, ci99, gc_paused, json_number, path_text

QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))
SPLIT = ("on_cpu", "runqueue", "blocked", "gil", "instrument", "awaiting", "loop_ready", "unknown")   # a stage's wall
# time; "gil": of the time off the CPU by the thread's own doing, waiting to take the GIL (the rest is "blocked")
SWITCHES = ("voluntary", "involuntary")


@dataclass(frozen=True)
class StageStats:
    """Statistics of one node of the stage tree (a path of stage names)."""
    path: Tuple[str, ...]
    calls: int
    errors: int
    wall_total: int
    wall_self: int
    wall_min: Optional[int]
    wall_max: Optional[int]
    cpu_total: Optional[int]
    cpu_self: Optional[int]
    cpu_calls: int
    hist: Mapping[int, int]
    counters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    gpu: Optional[Mapping[str, Any]] = None
    ops: Optional[Mapping[str, Any]] = None
    other: bool = False
    verdict: Optional[Mapping[str, Any]] = None
    # asyncio attribution: calls whose CPU time and counters were left out because they overlapped other tasks on
    # their thread with no switch hook to tell them apart; calls whose context died with the stage open (recorded up
    # to the task's last step); wall time the task was suspended inside the stage (total, and outside child stages)
    overlapped_calls: int = 0
    abandoned_calls: int = 0
    suspended_total: int = 0
    suspended_self: int = 0
    windows: Optional[Tuple[Mapping[str, Any], ...]] = None   # per merged source (Snapshot.merge): its sums
    items: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)   # {name: {"total", "calls"}}
    # under an overhead budget CPU time is read on a subset of the cpu_calls and cpu_total/cpu_self are
    # estimates over all of them (each read call weighted by the inverse of its chance of being read);
    # None: every one of the cpu_calls was read
    cpu_read_calls: Optional[int] = None
    # system (kernel) share of cpu_total/cpu_self, from the thread's rusage at the same reads; None: not measured
    cpu_sys_total: Optional[int] = None
    cpu_sys_self: Optional[int] = None
    # the estimates' variances (0 when every covered call was read): a 99 % interval is total +- 2.576 * sqrt(var)
    cpu_var: float = 0.0
    cpu_var_self: float = 0.0
    # estimated like CPU time, each {"total", "self", "var", "var_self", "reads"}: time ready in the run queue,
    # waiting for a CPU; CPU time of the process's threads that run no stage while the calls ran (helpers); and
    # the thread's voluntary / involuntary context switches
    runqueue: Optional[Mapping[str, Any]] = None
    helpers: Optional[Mapping[str, Any]] = None
    switches: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # of the suspended time, woken but waiting for the event loop to run the task (the rest was awaiting)
    loop_total: int = 0
    loop_self: int = 0
    # running wall time (wall less suspended) of the calls CPU time covers (cpu_calls): on CPU + run queue + blocked
    covered_run: int = 0
    covered_run_self: int = 0
    # instrument's own cost inside the stage's running time: the reads and bookkeeping at its child stages' boundaries
    # (self), and at every stage boundary below it (total); on a CPU, so out of its CPU time in the split
    instrument_total: int = 0
    instrument_self: int = 0
    # the stages that held the event loop while calls of this one were ready to run, {path text: ns}: the time each
    # held it (each moment once, however many calls waited) and the ready time of the calls it cost (summed over them)
    # of the time blocked (off the CPU by the thread's own doing), waiting to take the GIL, total and self: the blocked
    # time times the share of the GIL sampler's samples of it that found the thread waiting for the GIL; gil_samples
    # holds those samples' (estimated) numbers, {"gil", "blocked", "gil_total", "blocked_total"}, for the interval;
    # None where not sampled
    gil_total: Optional[int] = None
    gil_self: Optional[int] = None
    gil_samples: Optional[Mapping[str, float]] = None
    loop_blockers: Mapping[str, int] = field(default_factory=dict)
    loop_blockers_waited: Mapping[str, int] = field(default_factory=dict)
    # per rank of a torch.distributed job, {rank: {"calls", "errors", "wall_ns", "self_ns", "cpu_ns", "gpu_ns"}}: by
    # merge() of snapshots that name their rank (meta.distributed.rank); None for one process's snapshot
    ranks: Optional[Mapping[int, Mapping[str, Any]]] = None
    # memory per source ("host", "python", "cuda:0", "cuda:0:reserved"), the sums of the calls measured
    # (base.MEMORY_SUMS and peak_max): figures by memory(source); None where no call was measured
    memory: Optional[Mapping[str, Mapping[str, Any]]] = None

    def __post_init__(self) -> None:
        # helper threads' CPU is an estimate whose own part (total less the children's) may stray below 0: it is
        # clamped at 0 with its interval (a figure of CPU time is never negative)
        h = self.helpers
        if h is not None and (h["total"] < 0 or h["self"] < 0):
            object.__setattr__(self, "helpers", {**h, "total": max(h["total"], 0.0), "self": max(h["self"], 0.0)})

    def evolve(self, **fields: Any) -> "StageStats":
        """A copy with these fields changed, as dataclasses.replace() gives it but without running __init__ again
        (a tenth of its cost); new helpers are clamped as __post_init__ clamps them."""
        out = object.__new__(StageStats)
        out.__dict__.update(self.__dict__)
        out.__dict__.update(fields)
        if "helpers" in fields:
            out.__post_init__()
        return out

    def helpers_beyond_noise(self) -> float:
        """Helper threads' CPU in the stage's own time where it is beyond its 99 % interval at 0, else 0."""
        h = self.helpers
        if h is None:
            return 0.0
        return h["self"] if h["self"] - Z99 * math.sqrt(max(h["var_self"], 0.0)) > 0 else 0.0

    def memory_of(self, source: str = "host") -> Optional[Dict[str, Any]]:
        """A source's figures: per call, the peak above its start (mean and largest) and the net change (exit less
        entry), over the calls measured (the budget's read calls, weighted by 1 / their chance of being read, so the
        means stand for every call); net_total the mean times all calls; each mean's 99 % interval (normal, from the
        spread of the calls measured; the mean itself where every call was measured).  calls: measured and not
        overlapped; overlapped: measured while another thread or asyncio task had a stage event (a process-wide
        gauge: left out); marked: of the calls, those during which another party reset the gauge's peak (their
        peaks are lower bounds); fresh: of the calls, those whose peak was 1 MiB or more.  None where the source measured no call of the stage."""
        m = (self.memory or {}).get(source)
        if not m:
            return None
        n, w = m["calls"], m["w"]
        out: Dict[str, Any] = {"calls": n, "overlapped": m["overlapped"], "marked": m["marked"], "fresh": m["fresh"],
                               "peak_max": m.get("peak_max"), "peak_mean": None, "net_mean": None, "net_total": None}
        if not n or w <= 0:
            return out
        exact = n == self.calls
        for f in ("peak", "net"):
            mean = m[f"w_{f}"] / w
            if f == "peak" and m.get("peak_max") is not None:
                mean = min(mean, m["peak_max"])   # a weighted mean of equal peaks may round a hair above them
            var = max(m[f"{f}_sq"] / n - (m[f"{f}_sum"] / n) ** 2, 0.0) * n / (n - 1) if n > 1 else 0.0
            half = 0.0 if exact else Z99 * math.sqrt(var / n)
            out[f"{f}_mean"] = mean
            out[f"{f}_ci99"] = (max(mean - half, 0.0) if f == "peak" else mean - half, mean + half)
        out["net_total"] = out["net_mean"] * self.calls
        return out

    @property
    def memory_sources(self) -> Tuple[str, ...]:
        return tuple(self.memory or ())

    @classmethod
    def empty(cls, path: Tuple[str, ...]) -> "StageStats":
        """A stage with no calls (an ancestor still open when a snapshot was taken)."""
        return cls(path=tuple(path), calls=0, errors=0, wall_total=0, wall_self=0, wall_min=None, wall_max=None,
                   cpu_total=None, cpu_self=None, cpu_calls=0, hist={})

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def depth(self) -> int:
        return len(self.path) - 1

    @property
    def wall_mean(self) -> Optional[float]:
        return self.wall_total / self.calls if self.calls else None

    def quantile(self, q: float) -> Optional[float]:
        return _hist.quantiles(self.hist, [q], self.wall_min, self.wall_max)[0]

    @property
    def percentiles(self) -> Dict[str, Optional[float]]:
        vals = _hist.quantiles(self.hist, [q for _, q in QUANTILES], self.wall_min, self.wall_max)
        return {k: v for (k, _), v in zip(QUANTILES, vals)}

    @property
    def wall_ns(self) -> Dict[str, Any]:
        d = {"total": self.wall_total, "self": self.wall_self, "min": self.wall_min, "max": self.wall_max,
             "mean": self.wall_mean}
        d.update(self.percentiles)
        return d

    @property
    def cpu_reads(self) -> int:
        """Calls whose CPU time was read (the rest of cpu_calls are estimated from them)."""
        return self.cpu_calls if self.cpu_read_calls is None else self.cpu_read_calls

    @property
    def cpu_estimated(self) -> bool:
        """Whether cpu_total/cpu_self are estimates from a sample of the calls (cpu_read_calls is set)."""
        return self.cpu_read_calls is not None

    @property
    def cpu_user_total(self) -> Optional[int]:
        return None if self.cpu_sys_total is None or self.cpu_total is None else max(0, self.cpu_total - self.cpu_sys_total)

    @property
    def cpu_user_self(self) -> Optional[int]:
        return None if self.cpu_sys_self is None or self.cpu_self is None else max(0, self.cpu_self - self.cpu_sys_self)

    @property
    def sys_share(self) -> Optional[float]:
        """System (kernel) time / CPU time of the stage's own time (self), where both were measured."""
        if self.cpu_sys_self is None or not self.cpu_self:
            return None
        return min(1.0, max(0.0, self.cpu_sys_self / self.cpu_self))

    @property
    def cpu_ns(self) -> Dict[str, Any]:
        d = {"total": self.cpu_total, "self": self.cpu_self, "calls": self.cpu_calls, "read_calls": self.cpu_reads,
             "estimated": self.cpu_estimated}
        if self.cpu_estimated and self.cpu_total is not None:
            d.update(sd=math.sqrt(self.cpu_var), sd_self=math.sqrt(self.cpu_var_self),
                     ci99=[round(x, 3) for x in self.cpu_ci99])
        if self.helpers is not None:
            d["helpers"] = _schema.estimate_json(self.helpers)
        if self.cpu_sys_total is not None:
            d["sys"] = {"total": self.cpu_sys_total, "self": self.cpu_sys_self}
            d["user"] = {"total": self.cpu_user_total, "self": self.cpu_user_self}
        return d

    @property
    def cpu_ci99(self) -> Optional[Tuple[float, float]]:
        """The 99 % interval of cpu_total (the total itself when every covered call was read)."""
        return ci99(self.cpu_total, self.cpu_var, self.covered_run)

    @property
    def awaiting_total(self) -> int:
        return max(self.suspended_total - self.loop_total, 0)

    @property
    def awaiting_self(self) -> int:
        return max(self.suspended_self - self.loop_self, 0)

    def split_part(self, part: str, self_: bool = False) -> Optional[float]:
        """One part of the stage's wall time (SPLIT), total or self; None where it was not measured."""
        run = (self.wall_self - self.suspended_self) if self_ else (self.wall_total - self.suspended_total)
        cov = self.covered_run_self if self_ else self.covered_run
        cpu = self.cpu_self if self_ else self.cpu_total
        rq = None if self.runqueue is None else self.runqueue["self" if self_ else "total"]
        if part == "awaiting":
            return self.awaiting_self if self_ else self.awaiting_total
        if part == "loop_ready":
            return self.loop_self if self_ else self.loop_total
        if part == "unknown":
            return max(run - cov, 0) if cpu is not None else max(run, 0)
        if cpu is None:
            return None
        sdk = min(max(self.instrument_self if self_ else self.instrument_total, 0), max(cpu, 0))
        if part == "on_cpu":
            return cpu - sdk
        if part == "instrument":
            return sdk
        if part == "runqueue":
            return rq
        if rq is None and part in ("blocked", "gil"):
            return None
        off = max(cov - cpu - rq, 0)
        gil = self.gil_self if self_ else self.gil_total
        gil = None if gil is None else max(gil, 0)   # held: not cut to a later, smaller estimate of off
        if part == "gil":
            return gil
        if part == "blocked":
            return max(off - (gil or 0), 0)
        raise KeyError(f"no wall-time part {part!r}; the parts are: {', '.join(SPLIT)}")

    @property
    def wall_split(self) -> Optional[Dict[str, Dict[str, Any]]]:
        """The stage's wall time in parts (SPLIT), each {"total", "self"} and, where estimated, "ci99": on a CPU,
        ready in the run queue, blocked (off the CPU by its own doing: I/O, locks, sleep), awaiting (its asyncio
        task suspended, not yet woken), loop_ready (woken, waiting for the loop), unknown (running time no reading
        covers).  The parts add up to the wall time; None before any call."""
        if not self.calls:
            return None
        out: Dict[str, Dict[str, Any]] = {}
        for part in SPLIT:
            t, s_ = self.split_part(part), self.split_part(part, True)
            if t is None or (part == "unknown" and not t and not s_):
                continue
            d: Dict[str, Any] = {"total": json_number(t), "self": json_number(s_)}
            if part == "gil":
                d.update(self._gil_interval(t))
            elif part in ("on_cpu", "runqueue", "blocked") and self.cpu_estimated:
                var = self.cpu_var if part == "on_cpu" else (self.runqueue or {}).get("var", 0.0)
                if part == "blocked":
                    var = self.cpu_var + (self.runqueue or {}).get("var", 0.0)
                d["ci99"] = [round(x, 3) for x in ci99(t, var, self.covered_run)]   # as saved: a variance comes
                # back from its saved standard deviation to the last bit or so
            out[part] = d
        return out

    def _gil_interval(self, gil: float) -> Dict[str, Any]:
        """The GIL wait's samples and its 99 % interval: the blocked time it is a share of, times the share's Wilson
        interval over the samples of that time (a share of 1 from few samples still has room below it)."""
        n = {k: round(v, 3) for k, v in (self.gil_samples or {}).items()}   # as saved: a reload gives the same
        g, b = max(n.get("gil_total", 0.0), 0.0), max(n.get("blocked_total", 0.0), 0.0)
        off = gil + (self.split_part("blocked") or 0)
        out: Dict[str, Any] = {"samples": n}
        if b > 0:
            p, z = min(g / b, 1.0), Z99
            mid, half = (p + z * z / (2 * b)), z * math.sqrt(p * (1 - p) / b + z * z / (4 * b * b))
            lo, hi = (mid - half) / (1 + z * z / b), (mid + half) / (1 + z * z / b)
            out["ci99"] = [round(min(max(lo, 0.0), 1.0) * off, 3), round(min(max(hi, 0.0), 1.0) * off, 3)]
        else:
            out["ci99"] = [0.0, round(off, 3)]   # no sample found the thread blocked: any share of it may be the GIL
        return out

    def attributed_wall(self, wall: Optional[int] = None) -> Optional[float]:
        """Wall time (default: total) scaled to the calls whose CPU time and counters could be attributed
        (overlapped calls left out), for ratios of counters to wall time."""
        wall = self.wall_total if wall is None else wall
        if not self.calls or self.overlapped_calls >= self.calls:
            return None
        return wall * (self.calls - self.overlapped_calls) / self.calls if self.overlapped_calls else wall

    @property
    def suspended_share(self) -> Optional[float]:
        """Share of the stage's own wall time its task spent suspended (awaiting), over the attributed calls."""
        wall = self.attributed_wall(self.wall_self if self.wall_self else self.wall_total)
        if not wall:
            return None
        return min(1.0, self.suspended_self / wall)

    @property
    def cpu_ratio(self) -> Optional[float]:
        """CPU time / wall time over the calls whose CPU time was measured."""
        if self.cpu_total is None or not self.wall_total or not self.cpu_calls:
            return None
        wall = self.wall_total * (self.cpu_calls / self.calls) if self.calls else 0
        return self.cpu_total / wall if wall else None

    def counter(self, name: str, kind: str = "total") -> Optional[float]:
        c = self.counters.get(name)
        return None if c is None else c.get(kind)

    def item_total(self, name: str) -> Optional[float]:
        it = self.items.get(name)
        return None if it is None else it["total"]

    def per_item_ns(self, name: str) -> Optional[float]:
        """Wall time of the stage per item: total wall / items added (ns per token)."""
        n = self.item_total(name)
        return self.wall_total / n if n else None

    def item_rate(self, name: str) -> Optional[float]:
        """Items per second of the stage's wall time (tokens/s)."""
        n = self.item_total(name)
        return n / (self.wall_total / 1e9) if n is not None and self.wall_total else None

    def to_dict(self, percentiles: bool = True) -> Dict[str, Any]:
        """The stage as saved (docs/schema.md); percentiles=False leaves out p50..p999 (derived from `hist`)."""
        return _schema.stage_dict(self, percentiles)

    def window(self, start_time: Optional[float] = None, end_time: Optional[float] = None) -> Dict[str, Any]:
        """This stage's sums and median as one window (what merge() keeps of each source)."""
        return {"calls": self.calls, "wall_ns": self.wall_total, "p50_ns": json_number(self.quantile(0.5)),
                "cpu_ns": self.cpu_total if self.cpu_calls == self.calls else None,
                "counters": {k: v.get("total") for k, v in self.counters.items()},
                "items": {k: v["total"] for k, v in self.items.items()},
                "memory": {src: {"n": m["calls"], "w": m["w"], "w_peak": m["w_peak"], "peak_sum": m["peak_sum"],
                                 "peak_sq": m["peak_sq"]} for src, m in (self.memory or {}).items() if m["calls"]},
                "start_time": start_time, "end_time": end_time}

    def all_windows(self) -> Tuple[Mapping[str, Any], ...]:
        """The windows this stage was merged from (one when it was never merged)."""
        return tuple(self.windows) if self.windows is not None else (self.window(),)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StageStats":
        """A saved stage, checked (schema.stage_fields gives every field without a default): built as __init__
        would build it, without its call (a load builds thousands)."""
        fields = _schema.stage_fields(d)
        if not _REQUIRED <= fields.keys():
            raise TypeError(f"a stage needs {', '.join(sorted(_REQUIRED - fields.keys()))}")
        out = object.__new__(cls)
        out.__dict__.update(_DEFAULTS)
        for name, make in _FACTORIES:
            if name not in fields:
                out.__dict__[name] = make()
        out.__dict__.update(fields)
        out.__post_init__()
        return out


# StageStats' fields: those with a default, those made by a factory, those without either (from_dict)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(StageStats) if f.default is not dataclasses.MISSING}
_FACTORIES = [(f.name, f.default_factory) for f in dataclasses.fields(StageStats)
              if f.default_factory is not dataclasses.MISSING]
_REQUIRED = frozenset(f.name for f in dataclasses.fields(StageStats)) - _DEFAULTS.keys() - {n for n, _ in _FACTORIES}


def _tree_order(stages: Iterable[StageStats]) -> List[StageStats]:
    """Depth-first, children in first-seen order, with every ancestor present
    (an ancestor still open when the snapshot was taken gets an empty entry)."""
    by_path: Dict[Tuple[str, ...], StageStats] = {}
    order: List[Tuple[str, ...]] = []
    for s in stages:
        for k in range(1, len(s.path)):
            anc = s.path[:k]
            if anc not in by_path:
                by_path[anc] = StageStats.empty(anc)
                order.append(anc)
        if s.path in by_path and by_path[s.path].calls:
            by_path[s.path] = _merge.merge_stage(by_path[s.path], s)
        else:
            if s.path not in by_path:
                order.append(s.path)
            by_path[s.path] = s
    children: Dict[Tuple[str, ...], List[Tuple[str, ...]]] = {}
    for p in order:
        children.setdefault(p[:-1], []).append(p)
    out: List[StageStats] = []

    def walk(p: Tuple[str, ...]) -> None:
        for c in children.get(p, ()):
            out.append(by_path[c])
            walk(c)
    walk(())
    return out


class Snapshot:
    """Immutable per-stage breakdown plus meta.  Build one with
    `instrument.snapshot()`, `Snapshot.load(path)` or `Snapshot.from_dict(d)`."""

    __slots__ = ("_stages", "_meta", "_events", "_index", "_exemplars")

    def __init__(self, stages: Iterable[StageStats], meta: Optional[Mapping[str, Any]] = None,
                 events: Optional[Sequence[Mapping[str, Any]]] = None,
                 exemplars: Optional[Sequence[Mapping[str, Any]]] = None) -> None:
        self._stages: Tuple[StageStats, ...] = tuple(_tree_order(stages))
        self._meta: Dict[str, Any] = dict(meta or {})
        self._events: Tuple[Mapping[str, Any], ...] = tuple(events or ())
        self._exemplars: Tuple[Mapping[str, Any], ...] = tuple(exemplars or ())
        self._index: Dict[Tuple[str, ...], StageStats] = {s.path: s for s in self._stages}

    def replaced(self, stages: Sequence[StageStats], meta: Optional[Mapping[str, Any]] = None) -> "Snapshot":
        """A copy whose stages are `stages`: this snapshot's, in its order, with figures changed (verdicts, ...),
        so the tree needs no ordering again; `meta` in place of its meta where given."""
        stages = tuple(stages)
        if len(stages) != len(self._stages) or any(a.path != b.path for a, b in zip(stages, self._stages)):
            raise ValueError("Snapshot.replaced takes the snapshot's own stages, in its order")
        out = object.__new__(Snapshot)
        out._stages, out._events, out._exemplars = stages, self._events, self._exemplars
        out._meta = dict(self._meta if meta is None else meta)
        out._index = {s.path: s for s in stages}
        return out

    # ------------------------------------------------------------- reading
    @property
    def stages(self) -> Tuple[StageStats, ...]:
        return self._stages

    @property
    def meta(self) -> Dict[str, Any]:
        return json.loads(json.dumps(self._meta))   # a copy: the snapshot stays immutable

    @property
    def events(self) -> Tuple[Mapping[str, Any], ...]:
        return self._events

    @property
    def exemplars(self) -> Tuple[Mapping[str, Any], ...]:
        """Kept calls of root stages with their per-stage breakdown (slowest and typical)."""
        return self._exemplars

    def root_calls(self) -> Dict[str, int]:
        return {s.name: s.calls for s in self.roots}

    def __iter__(self) -> Iterator[StageStats]:
        return iter(self._stages)

    def __len__(self) -> int:
        return len(self._stages)

    def __getitem__(self, path) -> StageStats:
        key = as_path(path)
        try:
            return self._index[key]
        except KeyError:
            raise KeyError(f"no stage {path_text(key)!r}; the stages are: "
                           f"{', '.join(path_text(p) for p in list(self._index)[:20])}") from None

    def get(self, path, default=None) -> Optional[StageStats]:
        try:
            return self[path]
        except KeyError:
            return default

    def children(self, path=()) -> List[StageStats]:
        key = as_path(path)
        return [s for s in self._stages if s.path[:-1] == key]

    @property
    def roots(self) -> List[StageStats]:
        return self.children(())

    @property
    def total_ns(self) -> int:
        """Wall time of the top-level stages, summed."""
        return sum(s.wall_total for s in self.roots)

    def share_of_parent(self, s: StageStats) -> Optional[float]:
        parent = self._index.get(s.path[:-1]) if len(s.path) > 1 else None
        base = parent.wall_total if parent is not None else self.total_ns
        return s.wall_total / base if base else None

    def share_of_root(self, s: StageStats) -> Optional[float]:
        root = self._index.get(s.path[:1])
        return s.wall_total / root.wall_total if root is not None and root.wall_total else None

    def fold(self) -> "Snapshot":
        """One entry per stage name wherever it nested (recursion counted once per outermost call)."""
        acc: Dict[str, StageStats] = {}
        for s in self._stages:
            if not s.calls or s.name in s.path[:-1]:
                continue
            flat = replace(s, path=(s.name,))
            acc[s.name] = _merge.merge_stage(acc[s.name], flat) if s.name in acc else flat
        return Snapshot(acc.values(), dict(self._meta, folded=True))

    # --------------------------------------------------------- combination
    def merge(self, *others: "Snapshot") -> "Snapshot":
        """Exact for counts and sums; percentiles from the merged histograms."""
        for o in others:
            if not isinstance(o, Snapshot):
                raise TypeError(f"Snapshot.merge takes Snapshots, not {type(o).__name__}")
        return _merge.merge(self, others)

    def since(self, earlier: "Snapshot") -> "Snapshot":
        """What happened between `earlier` and this snapshot, both of the same process, or both merges
        in which every process of `earlier` is still there (workers, ranks): calls, sums, counters,
        per-rank figures and histograms subtracted exactly (percentiles within the histogram's 0.78 %).
        Stages without calls in the window are left out; a window of merges keeps no per-source
        windows, events or exemplars, and its duration is unknown (processes have their own clocks)."""
        if not isinstance(earlier, Snapshot):
            raise TypeError(f"Snapshot.since takes a Snapshot, not {type(earlier).__name__}")
        return _merge.since(self, earlier)

    # --------------------------------------------------------------- output
    def to_dict(self, percentiles: bool = True) -> Dict[str, Any]:
        return _schema.snapshot_dict(self, percentiles)

    def to_json(self, indent: Optional[int] = None, percentiles: bool = True) -> str:
        """percentiles=False: as a file holds it, without what loading derives again (the per-stage percentiles,
        which it recomputes from the histograms, and the rest `stage_dict` names)."""
        return json.dumps(self.to_dict(percentiles), indent=indent, allow_nan=False,
                          separators=None if indent is not None else (",", ":"))

    def save(self, path: "os.PathLike[str] | str") -> str:
        """Atomically: written to a temporary file beside `path`, fsynced, renamed; as to_json(percentiles=False)
        gives it.  On failure the previous file at `path` is left as it was."""
        return _schema.atomic_write(os.fspath(path), self.to_json(percentiles=False).encode())

    @classmethod
    def from_dict(cls, d: Any) -> "Snapshot":
        stages, meta, events, exemplars = _schema.snapshot_parts(d)
        return cls([StageStats.from_dict(s) for s in stages], meta, events, exemplars)

    @classmethod
    def load(cls, path: "os.PathLike[str] | str") -> "Snapshot":
        """The snapshot saved at `path`; one that carried verdicts (meta.judged) has its stages judged again
        (`judge`): a file holds no verdicts."""
        path = os.fspath(path)
        with gc_paused():
            d = _schema.read_file(path)
            try:
                snap = cls.from_dict(d)
            except SnapshotError as e:
                raise SnapshotError(f"{path}: {e}") from None
            return Snapshot.judge(snap) if Snapshot.judge is not None and snap._meta.get("judged") else snap

    def __repr__(self) -> str:
        return f"<Snapshot {len(self._stages)} stages, {self.total_ns / 1e6:.3f} ms total>"

    #: how notebooks (Jupyter, VS Code) show a Snapshot: the facade sets the HTML report here, so the model
    #: itself imports no exporter
    html_view: ClassVar[Optional[Callable[["Snapshot"], str]]] = None
    #: what gives a loaded snapshot's stages their verdicts (each judged when first read, by the thresholds the
    #: snapshot was recorded with): the facade sets the analysis here, so the model itself imports none
    judge: ClassVar[Optional[Callable[["Snapshot"], "Snapshot"]]] = None

    def _repr_html_(self) -> Optional[str]:
        """The Snapshot as a notebook shows it (html_view); None leaves the notebook its text repr."""
        return None if Snapshot.html_view is None else Snapshot.html_view(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


def load(path) -> Snapshot:
    return Snapshot.load(path)


def load_many(paths: Sequence[str]) -> Snapshot:
    """The files' snapshots, merged (merge_all), read one at a time."""
    return _merge.merge_all(Snapshot.load(p) for p in paths)
