"""The Snapshot: the one data model.

An immutable tree of per-stage statistics plus `meta`.  Reports, diff, merge,
every exporter and the CLI read Snapshots; none of them touches the live
collector, so a saved file can do everything a live snapshot can.  This module
imports nothing of the package but the histogram scheme.

JSON: {"format": "instrument-snapshot", "version": 1, "meta": {...},
       "stages": [...], "events": [...], "exemplars": [...]}; the schema is in docs/schema.md.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import histogram as _hist

FORMAT = "instrument-snapshot"
VERSION = 1
MAX_FILE_BYTES = 1 << 30          # refuse to read snapshot files over 1 GiB
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))
Z99 = 2.5758293035489   # the normal quantile of a two-sided 99 % interval
SPLIT = ("on_cpu", "runqueue", "blocked", "awaiting", "loop_ready", "unknown")   # a stage's wall time, in parts
SWITCHES = ("voluntary", "involuntary")
EXEMPLAR_SPLIT = ("on_cpu", "runqueue", "awaiting", "loop_ready")   # an exemplar part's split (blocked: the rest)
TOP_OPS = 10                                            # operators kept per ranking in a stage's `ops`
MAX_WINDOWS = 512          # windows kept per stage by merge(); beyond, neighbours are joined two by two
OP_FIELDS = ("calls", "self_cpu_ns", "cpu_total_ns", "device_ns")


class SnapshotError(ValueError):
    """A snapshot file or dict that cannot be read, with the reason."""


def name_text(name: str) -> str:
    """A stage name as it appears in a path: a '\\' or '/' inside it escaped with '\\'."""
    return name.replace("\\", "\\\\").replace("/", "\\/")


def path_text(path: Sequence[str]) -> str:
    """A path as one string: names joined by '/', each escaped by name_text, so a stage
    named "a/b" (`a\\/b`) never reads like "b" nested in "a" (`a/b`)."""
    return "/".join(name_text(n) for n in path)


def parse_path(text: str) -> Tuple[str, ...]:
    """The path a path_text string names (an unescaped '/' separates names)."""
    names, cur, k = [], [], 0
    while k < len(text):
        c = text[k]
        if c == "\\" and k + 1 < len(text) and text[k + 1] in "\\/":
            cur.append(text[k + 1])
            k += 2
            continue
        if c == "/":
            names.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        k += 1
    names.append("".join(cur))
    return tuple(names)


def as_path(path: Any) -> Tuple[str, ...]:
    """A path given as path_text or as a sequence of names."""
    return parse_path(path) if isinstance(path, str) else tuple(path)


def _num(x: Any) -> Any:
    return None if x is None else (int(x) if isinstance(x, float) and x.is_integer() and abs(x) < 2 ** 53 else x)


def ci99(total: Optional[float], var: float, upper: Optional[float] = None) -> Optional[Tuple[float, float]]:
    """The 99 % interval of an estimated sum with this variance (normal approximation), within [0, upper]."""
    if total is None:
        return None
    half = Z99 * math.sqrt(var) if var > 0 else 0.0
    lo, hi = max(total - half, 0.0), total + half
    if upper is not None:
        hi = min(hi, max(upper, total))
    return (lo, max(hi, lo))   # an estimate below 0 (a difference of clocks) has an interval of [0, 0] at least


def _estimate_json(e: Mapping[str, Any], upper: Optional[float] = None) -> Dict[str, Any]:
    """An estimate {"total", "self", "var", "var_self", "reads"} as saved: standard deviations, and the interval."""
    d = {"total": _num(round(e["total"], 3)), "self": _num(round(e["self"], 3)), "sd": math.sqrt(e["var"]),
         "sd_self": math.sqrt(e["var_self"]), "reads": e["reads"]}   # unrounded: a reloaded interval is the same
    if e["var"] > 0:   # from the total as saved, as a reloaded snapshot computes it
        d["ci99"] = [round(x, 3) for x in ci99(d["total"], e["var"], upper)]
    return d


def _estimate_from(path: Tuple[str, ...], what: str, raw: Any) -> Optional[Dict[str, Any]]:
    if raw is None:
        return None
    try:
        return {"total": float(raw["total"]), "self": float(raw.get("self", raw["total"])),
                "var": float(raw.get("sd", 0)) ** 2, "var_self": float(raw.get("sd_self", 0)) ** 2,
                "reads": int(raw.get("reads", 0))}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise SnapshotError(f"stage {path_text(path)}: {what} needs a total, got {str(raw)[:80]}") from None


def merge_estimate(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]],
                   sign: int = 1) -> Optional[Dict[str, Any]]:
    """Two estimates of disjoint calls as one (sign +1), or what the later one adds to the earlier (-1)."""
    if a is None or b is None:
        return dict(a) if a is not None else (dict(b) if b is not None and sign > 0 else None)
    out = {k: a[k] + sign * b[k] for k in ("total", "self", "var", "var_self", "reads")}
    for k in ("total", "var", "var_self", "reads"):
        out[k] = max(out[k], 0)
    return out


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
    # the stages that ran on the loop while this one was ready to run: {path text: ns}
    loop_blockers: Mapping[str, int] = field(default_factory=dict)
    # per rank of a torch.distributed job, {rank: {"calls", "errors", "wall_ns", "self_ns", "cpu_ns", "gpu_ns"}}: by
    # merge() of snapshots that name their rank (meta.distributed.rank); None for one process's snapshot
    ranks: Optional[Mapping[int, Mapping[str, Any]]] = None

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
            d["helpers"] = _estimate_json(self.helpers)
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
        if part == "on_cpu":
            return cpu
        if part == "runqueue":
            return rq
        if part == "blocked":
            return max(cov - cpu - (rq or 0), 0) if rq is not None else None
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
            d: Dict[str, Any] = {"total": _num(t), "self": _num(s_)}
            if part in ("on_cpu", "runqueue", "blocked") and self.cpu_estimated:
                var = self.cpu_var if part == "on_cpu" else (self.runqueue or {}).get("var", 0.0)
                if part == "blocked":
                    var = self.cpu_var + (self.runqueue or {}).get("var", 0.0)
                d["ci99"] = [round(x, 3) for x in ci99(t, var, self.covered_run)]   # as saved: a variance comes
                # back from its saved standard deviation to the last bit or so
            out[part] = d
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
        """percentiles=False leaves out p50..p999 (derived from `hist`; from_dict does not read them)."""
        wall = self.wall_ns if percentiles else {"total": self.wall_total, "self": self.wall_self,
                                                 "min": self.wall_min, "max": self.wall_max, "mean": self.wall_mean}
        d: Dict[str, Any] = {
            "path": list(self.path), "calls": self.calls, "errors": self.errors,
            "wall_ns": {k: _num(v) for k, v in wall.items()},
            "cpu_ns": self.cpu_ns,
            "counters": {k: _counter_json(v) for k, v in self.counters.items()},
            "hist": {"scheme": _hist.SCHEME, "buckets": [[i, c] for i, c in sorted(self.hist.items())]},
        }
        split = self.wall_split
        if split:
            if "runqueue" in split and self.runqueue is not None:
                split["runqueue"].update({k: v for k, v in _estimate_json(self.runqueue, self.covered_run).items()
                                          if k in ("sd", "sd_self", "reads")})
            split["covered_running"] = {"total": self.covered_run, "self": self.covered_run_self}
            d["wall_split_ns"] = split
        if self.switches:
            d["context_switches"] = {k: _estimate_json(v) for k, v in self.switches.items()}
        if self.loop_blockers:
            d["loop_blockers_ns"] = dict(self.loop_blockers)
        if self.other:
            d["other"] = True
        if self.overlapped_calls:
            d["cpu_ns"]["overlapped_calls"] = self.overlapped_calls
        if self.suspended_total:
            d["suspended_ns"] = {"total": self.suspended_total, "self": self.suspended_self}
        if self.abandoned_calls:
            d["abandoned_calls"] = self.abandoned_calls
        if self.gpu is not None:
            d["gpu"] = dict(self.gpu)
        if self.ops is not None:
            d["ops"] = self.ops
        if self.verdict is not None:
            d["verdict"] = dict(self.verdict)
        if self.windows is not None:
            d["windows"] = [dict(w, counters=dict(w.get("counters") or {}), items=dict(w.get("items") or {}))
                            for w in self.windows]
        if self.items:
            d["items"] = {k: {"total": _num(v["total"]), "calls": v["calls"]} for k, v in self.items.items()}
        if self.ranks is not None:
            d["ranks"] = [{"rank": r, **self.ranks[r]} for r in sorted(self.ranks)]
        return d

    def window(self, start_time: Optional[float] = None, end_time: Optional[float] = None) -> Dict[str, Any]:
        """This stage's sums and median as one window (what merge() keeps of each source)."""
        return {"calls": self.calls, "wall_ns": self.wall_total, "p50_ns": _num(self.quantile(0.5)),
                "cpu_ns": self.cpu_total if self.cpu_calls == self.calls else None,
                "counters": {k: v.get("total") for k, v in self.counters.items()},
                "items": {k: v["total"] for k, v in self.items.items()},
                "start_time": start_time, "end_time": end_time}

    def all_windows(self) -> Tuple[Mapping[str, Any], ...]:
        """The windows this stage was merged from (one when it was never merged)."""
        return tuple(self.windows) if self.windows is not None else (self.window(),)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StageStats":
        try:
            path = tuple(d["path"])
            if not path or not all(isinstance(p, str) for p in path):
                raise SnapshotError(f"stage path must be a non-empty list of strings, got {d['path']!r}")
            w, c = d["wall_ns"], d.get("cpu_ns") or {}
            h = d.get("hist") or {"scheme": _hist.SCHEME, "buckets": []}
            if h.get("scheme") != _hist.SCHEME:
                raise SnapshotError(f"stage {path_text(path)}: histogram scheme {h.get('scheme')!r} is not "
                                    f"{_hist.SCHEME!r}")
            calls = int(d["calls"])
            if calls < 0:
                raise SnapshotError(f"stage {path_text(path)}: calls must be >= 0, got {calls}")
            return cls(path=path, calls=calls, errors=int(d.get("errors", 0)),
                       wall_total=int(w["total"]), wall_self=int(w.get("self", w["total"])),
                       wall_min=None if w.get("min") is None else int(w["min"]),
                       wall_max=None if w.get("max") is None else int(w["max"]),
                       cpu_total=None if c.get("total") is None else int(c["total"]),
                       cpu_self=None if c.get("self") is None else int(c["self"]),
                       cpu_calls=int(c.get("calls", calls if c.get("total") is not None else 0)),
                       cpu_read_calls=int(c["read_calls"]) if c.get("estimated") else None,
                       cpu_sys_total=None if (c.get("sys") or {}).get("total") is None else int(c["sys"]["total"]),
                       cpu_sys_self=None if (c.get("sys") or {}).get("self") is None else int(c["sys"]["self"]),
                       hist=_hist.from_pairs(h.get("buckets", [])),
                       counters={k: _counter_from(v) for k, v in (d.get("counters") or {}).items()},
                       gpu=d.get("gpu"), ops=d.get("ops"), other=bool(d.get("other", False)),
                       verdict=d.get("verdict"), windows=_windows_from(path, d.get("windows")),
                       overlapped_calls=int(c.get("overlapped_calls", 0)),
                       abandoned_calls=int(d.get("abandoned_calls", 0)),
                       suspended_total=int((d.get("suspended_ns") or {}).get("total", 0)),
                       suspended_self=int((d.get("suspended_ns") or {}).get("self", 0)),
                       items=_items_from(path, d.get("items")), **_split_from(path, d, c),
                       ranks=_ranks_from(path, d.get("ranks")))
        except SnapshotError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SnapshotError(f"malformed stage entry {str(dict(d))[:200] if isinstance(d, Mapping) else d!r}: "
                                f"{type(e).__name__}: {e}") from None


def _counter_json(c: Mapping[str, Any]) -> Dict[str, Any]:
    """A counter's dict as saved: its variances as standard deviations, and its interval where estimated."""
    d = {k: v for k, v in c.items() if k not in ("var", "var_self")}
    if c.get("var") and c.get("total") is not None:
        d.update(sd=math.sqrt(c["var"]), sd_self=math.sqrt(c.get("var_self") or 0),
                 ci99=[round(x, 3) for x in ci99(c["total"], c["var"])])
    return d


def _counter_from(raw: Mapping[str, Any]) -> Dict[str, Any]:
    d = {k: v for k, v in dict(raw).items() if k not in ("sd", "sd_self", "ci99")}
    if raw.get("sd"):
        d.update(var=float(raw["sd"]) ** 2, var_self=float(raw.get("sd_self") or 0) ** 2)
    return d


def _split_from(path: Tuple[str, ...], d: Mapping[str, Any], c: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields of the wall-time split, the helpers and the context switches, from a saved stage."""
    split = d.get("wall_split_ns") or {}
    if not isinstance(split, Mapping):
        raise SnapshotError(f"stage {path_text(path)}: wall_split_ns must be an object")
    rq, loop, cov = split.get("runqueue"), split.get("loop_ready") or {}, split.get("covered_running") or {}
    switches = d.get("context_switches") or {}
    sd = float(c.get("sd") or 0), float(c.get("sd_self") or 0)
    return {"runqueue": _estimate_from(path, "wall_split_ns.runqueue", rq),
            "helpers": _estimate_from(path, "cpu_ns.helpers", c.get("helpers")),
            "switches": {k: _estimate_from(path, f"context_switches.{k}", v) for k, v in switches.items()},
            "loop_total": int(loop.get("total", 0)), "loop_self": int(loop.get("self", 0)),
            "covered_run": int(cov.get("total", 0)), "covered_run_self": int(cov.get("self", 0)),
            "cpu_var": sd[0] ** 2, "cpu_var_self": sd[1] ** 2,
            "loop_blockers": {str(k): int(v) for k, v in (d.get("loop_blockers_ns") or {}).items()}}


def _windows_from(path: Tuple[str, ...], raw: Any) -> Optional[Tuple[Dict[str, Any], ...]]:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(w, Mapping) for w in raw):
        raise SnapshotError(f"stage {path_text(path)}: windows must be a list of objects, got {str(raw)[:80]}")
    out = []
    for w in raw:
        calls, wall = w.get("calls"), w.get("wall_ns")
        if not isinstance(calls, int) or isinstance(calls, bool) or calls < 0 or not isinstance(wall, (int, float)):
            raise SnapshotError(f"stage {path_text(path)}: a window needs calls (an integer >= 0) and wall_ns "
                                f"(a number), got {str(dict(w))[:80]}")
        counters, items = w.get("counters") or {}, w.get("items") or {}
        if not isinstance(counters, Mapping) or not isinstance(items, Mapping):
            raise SnapshotError(f"stage {path_text(path)}: window counters and items must be objects")
        out.append({"calls": calls, "wall_ns": wall, "p50_ns": w.get("p50_ns"), "cpu_ns": w.get("cpu_ns"),
                    "counters": dict(counters), "items": dict(items), "start_time": w.get("start_time"),
                    "end_time": w.get("end_time")})
    return tuple(out)


def join_windows(windows: Sequence[Mapping[str, Any]]) -> Tuple[Dict[str, Any], ...]:
    """At most MAX_WINDOWS windows: while there are more, neighbours are joined two by
    two (a joined window is still a window, only longer; its median is the larger
    window's, an approximation)."""
    out = [dict(w) for w in windows]
    while len(out) > MAX_WINDOWS:
        pairs = []
        for k in range(0, len(out), 2):
            if k + 1 == len(out):
                pairs.append(out[k])
                continue
            a, b = out[k], out[k + 1]
            names = set(a.get("counters") or {}) | set(b.get("counters") or {})
            items = {n: (a.get("items") or {}).get(n, 0) + (b.get("items") or {}).get(n, 0)
                     for n in set(a.get("items") or {}) | set(b.get("items") or {})}
            big = a if a["calls"] >= b["calls"] else b
            starts = [t for t in (a.get("start_time"), b.get("start_time")) if t is not None]
            ends = [t for t in (a.get("end_time"), b.get("end_time")) if t is not None]
            pairs.append({"calls": a["calls"] + b["calls"], "wall_ns": a["wall_ns"] + b["wall_ns"],
                          "p50_ns": big.get("p50_ns"), "start_time": min(starts) if starts else None,
                          "end_time": max(ends) if ends else None,
                          "cpu_ns": None if a.get("cpu_ns") is None or b.get("cpu_ns") is None
                          else a["cpu_ns"] + b["cpu_ns"],
                          "counters": {n: None if (a.get("counters") or {}).get(n) is None
                                       or (b.get("counters") or {}).get(n) is None
                                       else a["counters"][n] + b["counters"][n] for n in names},
                          "items": items})
        out = pairs
    return tuple(out)


def _items_from(path: Tuple[str, ...], raw: Any) -> Dict[str, Dict[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SnapshotError(f"stage {path_text(path)}: items must be an object {{name: {{total, calls}}}}")
    out = {}
    for k, v in raw.items():
        total, calls = (v.get("total"), v.get("calls")) if isinstance(v, Mapping) else (None, None)
        if (not isinstance(total, (int, float)) or isinstance(total, bool) or not isinstance(calls, int)
                or total < 0 or calls < 0):
            raise SnapshotError(f"stage {path_text(path)}: item {k!r} needs a total >= 0 and calls >= 0, got {v!r}")
        out[str(k)] = {"total": total, "calls": calls}
    return out


def merge_items(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Items of two stages as one: totals and calls added."""
    out = {k: dict(v) for k, v in a.items()}
    for k, v in b.items():
        d = out.setdefault(k, {"total": 0, "calls": 0})
        d["total"] += v["total"]
        d["calls"] += v["calls"]
    return out


def _add(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def merge_counters(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {k: dict(v) for k, v in a.items()}
    for k, v in b.items():
        if k not in out:
            out[k] = dict(v)
            continue
        d = out[k]
        for f in ("total", "self", "enabled_ns", "running_ns", "counted_calls", "read_calls", "var", "var_self"):
            if f in d or f in v:
                d[f] = _add(d.get(f), v.get(f))
        d["scaled"] = bool(d.get("scaled")) or bool(v.get("scaled"))
        if d.get("estimated") or v.get("estimated"):
            d["estimated"] = True
        if d.get("enabled_ns"):
            d["running_fraction"] = (d.get("running_ns") or 0) / d["enabled_ns"]
    return out


def _combined_split(a: StageStats, b: StageStats, sign: int) -> Dict[str, Any]:
    """The split's fields of two recordings merged (sign +1), or of a window (-1: what `a` added to `b`)."""
    blockers = dict(a.loop_blockers)
    for k, v in b.loop_blockers.items():
        blockers[k] = blockers.get(k, 0) + sign * v
    return {"cpu_var": max(a.cpu_var + sign * b.cpu_var, 0.0), "cpu_var_self": max(a.cpu_var_self + sign * b.cpu_var_self, 0.0),
            "runqueue": merge_estimate(a.runqueue, b.runqueue, sign), "helpers": merge_estimate(a.helpers, b.helpers, sign),
            "switches": {k: merge_estimate(a.switches.get(k), b.switches.get(k), sign)
                         for k in set(a.switches) | set(b.switches)},
            "loop_total": a.loop_total + sign * b.loop_total, "loop_self": a.loop_self + sign * b.loop_self,
            "covered_run": a.covered_run + sign * b.covered_run,
            "covered_run_self": a.covered_run_self + sign * b.covered_run_self,
            "loop_blockers": {k: v for k, v in blockers.items() if v > 0}}


def _reads(a: StageStats, b: StageStats, sign: int) -> Optional[int]:
    """cpu_read_calls of a merge (sign +1) or of a window (-1): None while every call of both was read."""
    if a.cpu_read_calls is None and b.cpu_read_calls is None:
        return None
    return a.cpu_reads + sign * b.cpu_reads


def _sys(x: Optional[int], y: Optional[int], a: StageStats, b: StageStats) -> Optional[int]:
    """System time of a merge: known only where each side that measured CPU time also split it."""
    if (x is None and y is None) or (x is None and a.cpu_calls) or (y is None and b.cpu_calls):
        return None
    return (x or 0) + (y or 0)


def merge_stage(a: StageStats, b: StageStats, windows: bool = False) -> StageStats:
    """Sums added, histograms merged.  windows=True (Snapshot.merge): `a` and `b` are
    separate recordings, and the result keeps each one's sums as a window, so a
    comparison can measure the spread between them; otherwise (parts of one
    recording) no windows are kept."""
    def mn(x, y):
        return y if x is None else x if y is None else min(x, y)

    def mx(x, y):
        return y if x is None else x if y is None else max(x, y)

    gpu = a.gpu if b.gpu is None else merge_gpu(a.gpu, b.gpu)
    ops = a.ops if b.ops is None else merge_ops(a.ops, b.ops)
    return replace(a, calls=a.calls + b.calls, errors=a.errors + b.errors, wall_total=a.wall_total + b.wall_total,
                   wall_self=a.wall_self + b.wall_self, wall_min=mn(a.wall_min, b.wall_min),
                   wall_max=mx(a.wall_max, b.wall_max), cpu_total=_add(a.cpu_total, b.cpu_total),
                   cpu_self=_add(a.cpu_self, b.cpu_self), cpu_calls=a.cpu_calls + b.cpu_calls,
                   cpu_read_calls=_reads(a, b, +1), cpu_sys_total=_sys(a.cpu_sys_total, b.cpu_sys_total, a, b),
                   cpu_sys_self=_sys(a.cpu_sys_self, b.cpu_sys_self, a, b),
                   hist=_hist.merge(a.hist, b.hist), counters=merge_counters(a.counters, b.counters),
                   gpu=gpu, ops=ops, other=a.other or b.other, verdict=None,
                   overlapped_calls=a.overlapped_calls + b.overlapped_calls,
                   abandoned_calls=a.abandoned_calls + b.abandoned_calls,
                   suspended_total=a.suspended_total + b.suspended_total,
                   suspended_self=a.suspended_self + b.suspended_self,
                   windows=join_windows(a.all_windows() + b.all_windows()) if windows else None,
                   items=merge_items(a.items, b.items), **_combined_split(a, b, +1),
                   ranks=merge_ranks(a.ranks, b.ranks))


def gpu_fields(total: int, samples: int, dropped: int, errors: int, lo: Optional[int], hi: Optional[int],
               hist: Mapping[int, int]) -> Dict[str, Any]:
    """A stage's `gpu` dict from its sums and histogram of CUDA-event times."""
    p50, p99 = _hist.quantiles(hist, (0.5, 0.99), lo, hi)
    return {"total_ns": total, "samples": samples, "mean_ns": total / samples if samples else None, "min_ns": lo,
            "max_ns": hi, "p50_ns": p50, "p99_ns": p99, "dropped": dropped, "errors": errors,
            "hist": {"scheme": _hist.SCHEME, "buckets": [[i, c] for i, c in sorted(hist.items())]}}


def merge_gpu(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """Two `gpu` dicts as one: sums exact, percentiles from the merged histograms."""
    if a is None or b is None:
        return dict(b if a is None else a) if (a is not None or b is not None) else None

    def mm(f, k):
        xs = [d.get(k) for d in (a, b) if d.get(k) is not None]
        return f(xs) if xs else None
    h = _hist.merge(_hist.from_pairs((a.get("hist") or {}).get("buckets", [])),
                    _hist.from_pairs((b.get("hist") or {}).get("buckets", [])))
    total, samples, dropped, errors = (sum(int(d.get(k) or 0) for d in (a, b))
                                       for k in ("total_ns", "samples", "dropped", "errors"))
    return gpu_fields(total, samples, dropped, errors, mm(min, "min_ns"), mm(max, "max_ns"), h)


def ranked_ops(entries: Mapping[str, Mapping[str, int]], device_total: int, profiled: int) -> Dict[str, Any]:
    """A stage's `ops` dict: its operators ranked by self CPU time and by device time."""
    rows = list(entries.values())
    return {"by_self_cpu": sorted(rows, key=lambda r: (-r["self_cpu_ns"], r["name"]))[:TOP_OPS],
            "by_device": sorted((r for r in rows if r["device_ns"] > 0),
                                key=lambda r: (-r["device_ns"], r["name"]))[:TOP_OPS],
            "device_total_ns": int(device_total), "profiled_calls": int(profiled)}


def merge_ops(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """Two `ops` dicts as one: summed by operator name and ranked again (operators
    outside both top lists stay out; the totals are exact)."""
    if a is None or b is None:
        return dict(b if a is None else a) if (a is not None or b is not None) else None
    ops: Dict[str, Dict[str, Any]] = {}
    for d in (a, b):
        side = {r["name"]: r for key in ("by_self_cpu", "by_device") for r in d.get(key) or ()}
        for name, r in side.items():
            acc = ops.setdefault(name, {"name": name, **{f: 0 for f in OP_FIELDS}})
            for f in OP_FIELDS:
                acc[f] += int(r.get(f) or 0)
    return ranked_ops(ops, int(a.get("device_total_ns") or 0) + int(b.get("device_total_ns") or 0),
                      int(a.get("profiled_calls") or 0) + int(b.get("profiled_calls") or 0))


def _sub(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a if b is None or a is None else a - b


def _since(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """A sum's growth over a window; never negative (estimates under the overhead budget may dip a little)."""
    d = _sub(a, b)
    return None if d is None else max(d, 0)


def _since_counters(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for k, v in a.items():
        d, e = dict(v), b.get(k) or {}
        for f in ("total", "self", "enabled_ns", "running_ns", "counted_calls", "read_calls", "var", "var_self"):
            if f in d:
                d[f] = _since(d.get(f), e.get(f))
        if d.get("counted_calls") == 0:
            d.update(total=None, self=None)
        d["running_fraction"] = (d.get("running_ns") or 0) / d["enabled_ns"] if d.get("enabled_ns") else None
        out[k] = d
    return out


def _since_gpu(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if a is None or b is None:
        return None if a is None else dict(a)
    h = _hist.subtract(_hist.from_pairs((a.get("hist") or {}).get("buckets", [])),
                       _hist.from_pairs((b.get("hist") or {}).get("buckets", [])))
    total, samples, dropped, errors = (int(a.get(k) or 0) - int(b.get(k) or 0)
                                       for k in ("total_ns", "samples", "dropped", "errors"))
    lo, hi = _hist_range(h, a.get("min_ns"), a.get("max_ns"))
    return gpu_fields(total, samples, dropped, errors, lo, hi, h)


def _since_ops(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """Operators of the later snapshot less those of the earlier, by name (exact for operators in both top lists)."""
    if a is None or b is None:
        return None if a is None else dict(a)
    before = {r["name"]: r for key in ("by_self_cpu", "by_device") for r in b.get(key) or ()}
    ops: Dict[str, Dict[str, Any]] = {}
    for r in (r for key in ("by_self_cpu", "by_device") for r in a.get(key) or ()):
        e = before.get(r["name"], {})
        ops[r["name"]] = {"name": r["name"], **{f: max(0, int(r.get(f) or 0) - int(e.get(f) or 0)) for f in OP_FIELDS}}
    return ranked_ops({k: v for k, v in ops.items() if v["calls"]},
                      max(0, int(a.get("device_total_ns") or 0) - int(b.get("device_total_ns") or 0)),
                      max(0, int(a.get("profiled_calls") or 0) - int(b.get("profiled_calls") or 0)))


def _hist_range(h: Mapping[int, int], lo: Optional[int], hi: Optional[int]) -> Tuple[Optional[int], Optional[int]]:
    """Smallest and largest value a histogram can hold, within the known overall min and max."""
    if not h:
        return None, None
    first, last = _hist.bounds(min(h)), _hist.bounds(max(h))
    a, b = first[0], last[1] - 1
    return (a if lo is None else max(a, lo)), (b if hi is None else min(b, hi))


def _since_items(path: Tuple[str, ...], a: Mapping[str, Mapping[str, Any]],
                 b: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    out = {}
    for k, v in b.items():
        if k not in a or a[k]["calls"] < v["calls"] or a[k]["total"] < v["total"]:
            raise SnapshotError(f"stage {path_text(path)}: item {k!r} has {v['calls']} adds before and "
                                f"{a.get(k, {}).get('calls', 0)} after: not an earlier state of the same stage")
    for k, v in a.items():
        e = b.get(k) or {"total": 0, "calls": 0}
        if v["calls"] > e["calls"]:
            out[k] = {"total": v["total"] - e["total"], "calls": v["calls"] - e["calls"]}
    return out


def since_stage(a: StageStats, b: StageStats) -> StageStats:
    """What stage `a` recorded after `b`, an earlier state of the same stage: counts, sums and
    histograms subtracted exactly; min and max bounded by the window's histogram buckets."""
    if a.calls < b.calls or a.wall_total < b.wall_total or a.cpu_calls < b.cpu_calls:
        raise SnapshotError(f"stage {path_text(a.path)}: {b.calls} calls before and {a.calls} after: the earlier "
                            "snapshot is not an earlier state of the later one (out of order, or reset between)")
    try:
        h = _hist.subtract(a.hist, b.hist)
    except ValueError as e:
        raise SnapshotError(f"stage {path_text(a.path)}: {e}: not an earlier state of the same stage") from None
    calls = a.calls - b.calls
    lo, hi = (a.wall_min, a.wall_max) if b.calls == 0 else _hist_range(h, a.wall_min, a.wall_max)
    cpu_calls = a.cpu_calls - b.cpu_calls
    return replace(a, calls=calls, errors=a.errors - b.errors, wall_total=a.wall_total - b.wall_total,
                   wall_self=a.wall_self - b.wall_self, wall_min=lo, wall_max=hi,
                   cpu_total=_since(a.cpu_total, b.cpu_total) if cpu_calls else None,
                   cpu_self=_since(a.cpu_self, b.cpu_self) if cpu_calls else None, cpu_calls=cpu_calls, hist=h,
                   cpu_read_calls=_reads(a, b, -1),
                   cpu_sys_total=_since(a.cpu_sys_total, b.cpu_sys_total) if cpu_calls else None,
                   cpu_sys_self=_since(a.cpu_sys_self, b.cpu_sys_self) if cpu_calls else None,
                   counters=_since_counters(a.counters, b.counters), gpu=_since_gpu(a.gpu, b.gpu),
                   ops=_since_ops(a.ops, b.ops), verdict=None,
                   overlapped_calls=a.overlapped_calls - b.overlapped_calls,
                   abandoned_calls=a.abandoned_calls - b.abandoned_calls,
                   suspended_total=a.suspended_total - b.suspended_total,
                   suspended_self=a.suspended_self - b.suspended_self, items=_since_items(a.path, a.items, b.items),
                   ranks=since_ranks(a.path, a.ranks, b.ranks), **_combined_split(a, b, -1))


# ------------------------------------------------------------------ exemplars
# One dict per kept call of a root stage: {"path": [root], "wall_ns", "start_ns" (since the start of recording),
# "pid", "tid", "seq" (the call's number in its process), "slow" (among the K slowest), "sample" (in the uniform
# sample of typical calls), "breakdown": [{"path", "wall_ns"}, ...] (self time of each stage in that call)}.

def _exemplar_from(d: Any) -> Dict[str, Any]:
    try:
        path = d["path"]
        if not isinstance(path, list) or len(path) != 1 or not isinstance(path[0], str):
            raise SnapshotError(f"exemplar path must be a one-name list (a root stage), got {path!r}")
        parts = []
        for b in d.get("breakdown") or []:
            bp = b["path"]
            if not isinstance(bp, list) or not bp or not all(isinstance(x, str) for x in bp):
                raise SnapshotError(f"exemplar breakdown path must be a list of names, got {bp!r}")
            part = {"path": list(bp), "wall_ns": int(b["wall_ns"])}
            split = b.get("split")
            if isinstance(split, Mapping):   # how that stage's self time went in the call (None: not read)
                part["split"] = {k: None if split.get(k) is None else int(split[k]) for k in EXEMPLAR_SPLIT}
            parts.append(part)
        out = {"path": list(path), "wall_ns": int(d["wall_ns"]), "start_ns": int(d.get("start_ns") or 0),
               "pid": d.get("pid"), "tid": d.get("tid"), "seq": d.get("seq"), "slow": bool(d.get("slow")),
               "sample": bool(d.get("sample")), "breakdown": parts}
        if out["wall_ns"] < 0:
            raise SnapshotError(f"exemplar wall_ns must be >= 0, got {out['wall_ns']}")
        return out
    except SnapshotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SnapshotError(f"malformed exemplar {str(d)[:200]}: {type(e).__name__}: {e}") from None


def _xkey(e: Mapping[str, Any]) -> tuple:
    return (e.get("pid"), e.get("seq"), e.get("start_ns"), e["wall_ns"])


def merge_exemplars(groups: Sequence[Tuple[Sequence[Mapping[str, Any]], Mapping[str, int]]]) -> List[Dict[str, Any]]:
    """Exemplars of several snapshots as one set: per root stage the slowest calls of all
    (as many as the most any one side kept) and a sample of typical calls drawn from each side
    in proportion to its calls of that root (`groups`: (exemplars, {root: calls}) per side)."""
    roots = list(dict.fromkeys(e["path"][0] for ex, _ in groups for e in ex))
    out: List[Dict[str, Any]] = []
    for r in roots:
        sides = [[e for e in ex if e["path"][0] == r] for ex, _ in groups]
        k = max(sum(1 for e in side if e["slow"]) for side in sides)
        slow = sorted((e for side in sides for e in side if e["slow"]), key=lambda e: -e["wall_ns"])[:k]
        samples = [[e for e in side if e["sample"]] for side in sides]
        budget = max(len(x) for x in samples)
        weights = [calls.get(r, 0) or len(x) for (_, calls), x in zip(groups, samples)]
        total = sum(weights) or 1
        shares = [min(len(x), int(round(budget * w / total))) for x, w in zip(samples, weights)]
        picked = [e for x, n in zip(samples, shares) for e in x[:n]]
        keep: Dict[tuple, Dict[str, Any]] = {}
        for e in slow:
            keep[_xkey(e)] = dict(e, slow=True, sample=False)
        for e in picked:
            keep.setdefault(_xkey(e), dict(e, slow=False))["sample"] = True
        out.extend(keep.values())
    return out


# ---------------------------------------------------------------------- ranks
# A process of a torch.distributed job names itself in meta["distributed"] ({"rank", "world_size", "local_rank",
# "host", ...}); merge() keeps each stage's figures per rank (StageStats.ranks) and each source's rank in
# meta.merged_from.  Collectives timed by the SDK are stages named COLLECTIVE_PREFIX + the torch.distributed function.

RANK_KEY = "distributed"
RANK_FIELDS = ("calls", "errors", "wall_ns", "self_ns", "cpu_ns", "gpu_ns")
COLLECTIVE_PREFIX = "dist."
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_single", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast",
               "reduce", "barrier", "send", "recv")


def is_collective(name: str) -> bool:
    """Whether a stage name is that of a torch.distributed collective (or send/recv) the SDK timed."""
    return name.startswith(COLLECTIVE_PREFIX) and name[len(COLLECTIVE_PREFIX):] in COLLECTIVES


def rank_of(meta: Mapping[str, Any]) -> Optional[int]:
    """The rank of the one process a snapshot recorded; None when it names none (or merges several)."""
    d = meta.get(RANK_KEY)
    r = d.get("rank") if isinstance(d, Mapping) and not meta.get("merged_from") else None
    return r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else None


def rank_figures(s: StageStats) -> Dict[str, Any]:
    """A stage's figures as one rank's entry of StageStats.ranks."""
    return {"calls": s.calls, "errors": s.errors, "wall_ns": s.wall_total, "self_ns": s.wall_self,
            "cpu_ns": s.cpu_total, "gpu_ns": (s.gpu or {}).get("total_ns")}


def merge_ranks(a: Optional[Mapping[int, Mapping[str, Any]]],
                b: Optional[Mapping[int, Mapping[str, Any]]]) -> Optional[Dict[int, Dict[str, Any]]]:
    """Per-rank figures of two stages as one: a rank's figures added (a rank recorded twice: a restart)."""
    if a is None or b is None:
        return None if a is None and b is None else {r: dict(f) for r, f in (a if b is None else b).items()}
    out = {r: dict(f) for r, f in a.items()}
    for r, f in b.items():
        out[r] = {k: _add(out[r].get(k), f.get(k)) for k in RANK_FIELDS} if r in out else dict(f)
    return out


def since_ranks(path: Tuple[str, ...], a: Optional[Mapping[int, Mapping[str, Any]]],
                b: Optional[Mapping[int, Mapping[str, Any]]]) -> Optional[Dict[int, Dict[str, Any]]]:
    """Per-rank figures recorded after `b`, an earlier state of `a`; ranks without calls in the window left out."""
    if b is None:
        return None if a is None else {r: dict(f) for r, f in a.items()}
    for r, f in b.items():
        if a is None or r not in a or a[r]["calls"] < f["calls"]:
            raise SnapshotError(f"stage {path_text(path)}: rank {r} has {f['calls']} calls before and "
                                f"{(a or {}).get(r, {}).get('calls', 0)} after: not an earlier state of the same stage")
    out = {}
    for r, f in (a or {}).items():
        e = b.get(r)
        w = dict(f) if e is None else {k: _since(f.get(k), e.get(k)) for k in RANK_FIELDS}
        if w["calls"]:
            out[r] = w
    return out


def _ranks_from(path: Tuple[str, ...], raw: Any) -> Optional[Dict[int, Dict[str, Any]]]:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(x, Mapping) for x in raw):
        raise SnapshotError(f"stage {path_text(path)}: ranks must be a list of objects, got {str(raw)[:80]}")
    out: Dict[int, Dict[str, Any]] = {}
    for x in raw:
        counts = [x.get(k) for k in ("rank", "calls", "errors")]
        numbers = [x.get(k) for k in RANK_FIELDS[2:]]
        if (not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts) or counts[0] in out
                or x.get("wall_ns") is None or x.get("self_ns") is None
                or not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)
                           for v in numbers)):
            raise SnapshotError(f"stage {path_text(path)}: a ranks entry needs a rank (once), calls and errors "
                                f"(integers >= 0), wall_ns and self_ns >= 0, cpu_ns and gpu_ns >= 0 or null; got "
                                f"{str(dict(x))[:80]}")
        r = counts[0]
        out[r] = {k: x.get(k) for k in RANK_FIELDS}
    return out


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
            by_path[s.path] = merge_stage(by_path[s.path], s)
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
            acc[s.name] = merge_stage(acc[s.name], flat) if s.name in acc else flat
        return Snapshot(acc.values(), dict(self._meta, folded=True))

    # --------------------------------------------------------- combination
    def merge(self, *others: "Snapshot") -> "Snapshot":
        """Exact for counts and sums; percentiles from the merged histograms."""
        stages: Dict[Tuple[str, ...], StageStats] = {s.path: _stamped(s, self._meta) for s in self._stages}
        meta = dict(self._meta)
        sources = list(meta.get("merged_from") or [_source(meta)])
        events = list(self._events)
        xgroups = [(self._exemplars, self.root_calls())]
        for o in others:
            if not isinstance(o, Snapshot):
                raise TypeError(f"Snapshot.merge takes Snapshots, not {type(o).__name__}")
            xgroups.append((o._exemplars, o.root_calls()))
            for s in o._stages:
                s = _stamped(s, o._meta)
                stages[s.path] = merge_stage(stages[s.path], s, windows=True) if s.path in stages else s
            sources.extend(o._meta.get("merged_from") or [_source(o._meta)])
            events.extend(o._events)
            for k in ("start_time", "end_time"):
                a, b = meta.get(k), o._meta.get(k)
                if a is not None and b is not None:
                    meta[k] = min(a, b) if k == "start_time" else max(a, b)
            for k, v in (o._meta.get("exits") or {}).items():
                meta.setdefault("exits", {})
                meta["exits"][k] = meta["exits"].get(k, 0) + v
        meta["merged_from"] = sources
        meta.pop(RANK_KEY, None)   # the first process's rank; each source keeps its own
        exemplars = merge_exemplars([g for g in xgroups if g[0]]) if any(g[0] for g in xgroups) else []
        return Snapshot(stages.values(), meta, events, exemplars)

    def since(self, earlier: "Snapshot") -> "Snapshot":
        """What happened between `earlier` and this snapshot, both of the same process, or both merges
        in which every process of `earlier` is still there (workers, ranks): calls, sums, counters,
        per-rank figures and histograms subtracted exactly (percentiles within the histogram's 0.78 %).
        Stages without calls in the window are left out; a window of merges keeps no per-source
        windows, events or exemplars, and its duration is unknown (processes have their own clocks)."""
        if not isinstance(earlier, Snapshot):
            raise TypeError(f"Snapshot.since takes a Snapshot, not {type(earlier).__name__}")
        a, b = self._meta, earlier._meta
        merged = bool(a.get("merged_from") or b.get("merged_from"))
        if merged:
            now = set(_processes(a))
            gone = [p for p in _processes(b) if p not in now]
            if gone:
                raise SnapshotError(f"since: process {gone[0][0]} on {gone[0][1]} of the earlier snapshot left the "
                                    "merge (restarted, reset or its file removed): a new window starts")
        elif (a.get("pid"), a.get("host")) != (b.get("pid"), b.get("host")):
            raise SnapshotError(f"since: the snapshots are of different processes (pid {b.get('pid')} on "
                                f"{b.get('host')} and pid {a.get('pid')} on {a.get('host')})")
        elif a.get("start_time") != b.get("start_time"):
            raise SnapshotError("since: the process was reset between the two snapshots (their start times differ)")
        elif (a.get("duration_ns") or 0) < (b.get("duration_ns") or 0):
            raise SnapshotError("since: the earlier snapshot was taken after this one; call later.since(earlier)")
        stages = []
        for s in self._stages:
            old = earlier._index.get(s.path)
            w = since_stage(s, old) if old is not None else s
            if w.calls or w.wall_total or w.items:
                stages.append(replace(w, windows=None) if merged else w)
        for path in earlier._index:
            if path not in self._index and earlier._index[path].calls:
                raise SnapshotError(f"since: stage {path_text(path)} is in the earlier snapshot only: not an earlier "
                                    "state of this one")
        meta = dict(a)
        meta["window"] = {"start_time": b.get("end_time"), "end_time": a.get("end_time"),
                          "duration_ns": None if merged else (a.get("duration_ns") or 0) - (b.get("duration_ns") or 0)}
        if merged:
            return Snapshot(stages, meta)
        events = [e for e in self._events if (e.get("ts_ns") or 0) >= (b.get("duration_ns") or 0)]
        # the calls kept now that started in the window (the store keeps the slowest since the start, so a
        # window's slowest calls are there unless slower ones came before them)
        exemplars = [e for e in self._exemplars if e["start_ns"] >= (b.get("duration_ns") or 0)]
        return Snapshot(stages, meta, events, exemplars)

    # --------------------------------------------------------------- output
    def to_dict(self, percentiles: bool = True) -> Dict[str, Any]:
        out = {"format": FORMAT, "version": VERSION, "meta": self.meta,
               "stages": [s.to_dict(percentiles) for s in self._stages]}
        if self._events:
            out["events"] = [dict(e) for e in self._events]
        if self._exemplars:
            out["exemplars"] = [dict(e, path=list(e["path"]), breakdown=[dict(b) for b in e["breakdown"]])
                                for e in self._exemplars]
        return out

    def to_json(self, indent: Optional[int] = None, percentiles: bool = True) -> str:
        """percentiles=False: without the per-stage percentiles, which loading recomputes from the histograms."""
        return json.dumps(self.to_dict(percentiles), indent=indent, allow_nan=False)

    def save(self, path: "os.PathLike[str] | str") -> str:
        """Atomically: written to a temporary file beside `path`, fsynced, renamed.
        On failure the previous file at `path` is left as it was."""
        return atomic_write(os.fspath(path), self.to_json().encode())

    @classmethod
    def from_dict(cls, d: Any) -> "Snapshot":
        if not isinstance(d, Mapping):
            raise SnapshotError(f"a snapshot is a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise SnapshotError(f"not an instrument snapshot: format is {d.get('format')!r}, expected {FORMAT!r}")
        v = d.get("version")
        if not isinstance(v, int) or isinstance(v, bool):
            raise SnapshotError(f"snapshot version must be an integer, got {v!r}")
        if v > VERSION:
            raise SnapshotError(f"snapshot version {v} is newer than this instrument reads (version {VERSION}); "
                                "upgrade instrument")
        if v < 1:
            raise SnapshotError(f"snapshot version {v} is not valid (versions start at 1)")
        stages = d.get("stages")
        if not isinstance(stages, list):
            raise SnapshotError("snapshot has no 'stages' list")
        meta = d.get("meta") or {}
        if not isinstance(meta, Mapping):
            raise SnapshotError("snapshot 'meta' must be an object")
        events = d.get("events") or []
        if not isinstance(events, list):
            raise SnapshotError("snapshot 'events' must be a list")
        exemplars = d.get("exemplars") or []
        if not isinstance(exemplars, list):
            raise SnapshotError("snapshot 'exemplars' must be a list")
        return cls([StageStats.from_dict(s) for s in stages], meta, events, [_exemplar_from(e) for e in exemplars])

    @classmethod
    def load(cls, path: "os.PathLike[str] | str") -> "Snapshot":
        path = os.fspath(path)
        try:
            size = os.path.getsize(path)
        except OSError as e:
            raise SnapshotError(f"{path}: cannot read: {e.strerror or e}") from None
        if size > MAX_FILE_BYTES:
            raise SnapshotError(f"{path}: {size} bytes is over the {MAX_FILE_BYTES} byte limit for snapshot files")
        if size == 0:
            raise SnapshotError(f"{path}: file is empty")
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
            d = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise SnapshotError(f"{path}: not a snapshot: the file is not UTF-8 text (binary?)") from None
        except json.JSONDecodeError as e:
            raise SnapshotError(f"{path}: not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}") from None
        except OSError as e:
            raise SnapshotError(f"{path}: cannot read: {e.strerror or e}") from None
        except RecursionError:
            raise SnapshotError(f"{path}: JSON nested too deeply") from None
        try:
            return cls.from_dict(d)
        except SnapshotError as e:
            raise SnapshotError(f"{path}: {e}") from None

    def __repr__(self) -> str:
        return f"<Snapshot {len(self._stages)} stages, {self.total_ns / 1e6:.3f} ms total>"

    #: how notebooks (Jupyter, VS Code) show a Snapshot: the facade sets the HTML report here, so the model
    #: itself imports no exporter
    html_view: ClassVar[Optional[Callable[["Snapshot"], str]]] = None

    def _repr_html_(self) -> Optional[str]:
        """The Snapshot as a notebook shows it (html_view); None leaves the notebook its text repr."""
        return None if Snapshot.html_view is None else Snapshot.html_view(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


def atomic_write(path: str, data: bytes) -> str:
    """Write `data` to a temporary file beside `path`, fsync, rename: on failure
    the previous file at `path` is left as it was and no temporary remains."""
    fd, tmp = tempfile.mkstemp(prefix=".instrument-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)    # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _stamped(s: StageStats, meta: Mapping[str, Any]) -> StageStats:
    """A stage of a snapshot being merged, as one window with its snapshot's times, and as its rank's figures
    where the snapshot names its rank."""
    if not s.calls:
        return s
    fields: Dict[str, Any] = {}
    if s.windows is None:
        fields["windows"] = (s.window(meta.get("start_time"), meta.get("end_time")),)
    rank = rank_of(meta)
    if rank is not None and s.ranks is None:
        fields["ranks"] = {rank: rank_figures(s)}
    return replace(s, **fields) if fields else s


def _processes(meta: Mapping[str, Any]) -> List[Tuple[Any, Any, Any]]:
    """(pid, host, start_time) of every process a snapshot holds (one recording each)."""
    return [(x.get("pid"), x.get("host"), x.get("start_time")) for x in (meta.get("merged_from") or [meta])]


def _source(meta: Mapping[str, Any]) -> Dict[str, Any]:
    """What a merged snapshot keeps of each source: its process, its times, its machine (meta.machine), its rank."""
    src = {k: meta.get(k) for k in ("pid", "host", "start_time", "end_time")}
    if "machine" in meta:
        src["machine"] = meta["machine"]
    if rank_of(meta) is not None:
        src.update({k: meta[RANK_KEY].get(k) for k in ("rank", "local_rank", "world_size")})
    return src


def load(path) -> Snapshot:
    return Snapshot.load(path)


def merge_all(snaps: Iterable[Snapshot], progress: Optional[Callable[[int], None]] = None) -> Snapshot:
    """The exact merge of snapshots (Snapshot.merge), one at a time; timeline events and exemplars keep
    their process (`pid`) and are put on the merged snapshot's time base; a snapshot that names its rank
    is a merge of one (its figures per rank).  progress(k) after the k-th."""
    acc: Optional[Snapshot] = None
    events: List[Dict[str, Any]] = []
    for k, s in enumerate(snaps, 1):
        m = s.meta   # a copy: merging never touches the snapshots merged
        base = round((m.get("start_time") or 0) * 1e9)
        events += [dict(e, pid=e.get("pid", m.get("pid")), ts_ns=e["ts_ns"] + base) for e in s.events]
        bare = Snapshot(s.stages, m, None, [dict(e, pid=e.get("pid", m.get("pid")), start_ns=e["start_ns"] + base)
                                            for e in s.exemplars])
        acc = (bare.merge() if rank_of(m) is not None else bare) if acc is None else acc.merge(bare)
        if progress:
            progress(k)
    if acc is None:
        raise SnapshotError("no snapshot files given")
    t0 = round((acc._meta.get("start_time") or 0) * 1e9)
    return Snapshot(acc.stages, acc._meta, [dict(e, ts_ns=e["ts_ns"] - t0) for e in events],
                    [dict(e, start_ns=e["start_ns"] - t0) for e in acc.exemplars])


def load_many(paths: Sequence[str]) -> Snapshot:
    """The files' snapshots, merged (merge_all), read one at a time."""
    return merge_all(Snapshot.load(p) for p in paths)
