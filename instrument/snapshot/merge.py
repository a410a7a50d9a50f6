"""Merge and window rules: several recordings as one (sums exact, histograms merged, each source kept as a
window, per-rank figures, exemplars), and what a recording added after an earlier state of itself (since).
Stage-level rules take StageStats and the snapshot-level ones Snapshots (built as their own type), so this
module needs neither class."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .. import histogram as _hist
from .base import MEMORY_SUMS, WINDOW_MEMORY, SnapshotError, counted_nothing, gc_paused, growth, path_text, sum_known
from .ranks import RANK_KEY, merge_ranks, rank_figures, rank_of, since_ranks

TOP_OPS = 10                                            # operators kept per ranking in a stage's `ops`
MAX_WINDOWS = 512          # windows kept per stage by merge(); beyond, neighbours are joined two by two
OP_FIELDS = ("calls", "self_cpu_ns", "cpu_total_ns", "device_ns")

Stage = Any      # a StageStats (model.py, which builds on this module)
Snap = Any       # a Snapshot


def merge_estimate(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]],
                   sign: int = 1) -> Optional[Dict[str, Any]]:
    """Two estimates of disjoint calls as one (sign +1), or what the later one adds to the earlier (-1)."""
    if a is None or b is None:
        return dict(a) if a is not None else (dict(b) if b is not None and sign > 0 else None)
    return {"total": max(a["total"] + sign * b["total"], 0), "self": a["self"] + sign * b["self"],
            "var": max(a["var"] + sign * b["var"], 0), "var_self": max(a["var_self"] + sign * b["var_self"], 0),
            "reads": max(a["reads"] + sign * b["reads"], 0)}


def join_windows(windows: Sequence[Mapping[str, Any]]) -> Tuple[Dict[str, Any], ...]:
    """At most MAX_WINDOWS windows: while there are more, neighbours are joined two by
    two (a joined window is still a window, only longer; its median is the larger
    window's, an approximation).  The windows are shared, not copied (none is changed in place: a join is a new
    one), so a merge of n recordings does not copy O(n^2) of them."""
    out = list(windows)
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
                          "items": items, "memory": _window_memory(a, b)})
        out = pairs
    return tuple(out)


def _window_memory(a: Mapping[str, Any], b: Mapping[str, Any]) -> Dict[str, Dict[str, float]]:
    """Two windows' memory sums as one: a source both have, added."""
    ma, mb = a.get("memory") or {}, b.get("memory") or {}
    return {src: {k: ma[src][k] + mb[src][k] for k in WINDOW_MEMORY} for src in set(ma) & set(mb)}


def merge_items(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Items of two stages as one: totals and calls added."""
    out = {k: dict(v) for k, v in a.items()}
    for k, v in b.items():
        d = out.setdefault(k, {"total": 0, "calls": 0})
        d["total"] += v["total"]
        d["calls"] += v["calls"]
    return out


COUNTER_SUMS = ("total", "self", "enabled_ns", "running_ns", "counted_calls", "read_calls", "var", "var_self")


def merge_counters(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {k: dict(v) for k, v in a.items()}
    for k, v in b.items():
        d = out.get(k)
        if d is None:
            out[k] = dict(v)
            continue
        if counted_nothing(v):   # adds nothing (the common case of an event this machine cannot open)
            d["scaled"] = bool(d.get("scaled"))
            continue
        for f in COUNTER_SUMS:
            y = v.get(f)
            if y is None:
                if f in v and f not in d:
                    d[f] = None
                continue
            x = d.get(f)
            d[f] = y if x is None else x + y
        d["scaled"] = bool(d.get("scaled")) or bool(v.get("scaled"))
        if d.get("estimated") or v.get("estimated"):
            d["estimated"] = True
        if d.get("enabled_ns"):
            d["running_fraction"] = (d.get("running_ns") or 0) / d["enabled_ns"]
    return out


def _combined_gil(a: Stage, b: Stage, sign: int) -> Dict[str, Any]:
    """The GIL wait and its samples of two recordings merged (sign +1), or of a window (-1); None where neither
    was sampled (one that was not adds nothing)."""
    if a.gil_total is None and b.gil_total is None:
        return {"gil_total": None, "gil_self": None, "gil_samples": None}
    if b.gil_total is None or a.gil_total is None:
        x = a if a.gil_total is not None else b
        if sign < 0 and x is b:
            return {"gil_total": None, "gil_self": None, "gil_samples": None}
        return {"gil_total": x.gil_total, "gil_self": x.gil_self, "gil_samples": dict(x.gil_samples or {})}
    na, nb = a.gil_samples or {}, b.gil_samples or {}
    return {"gil_total": max(a.gil_total + sign * b.gil_total, 0), "gil_self": max(a.gil_self + sign * b.gil_self, 0),
            "gil_samples": {k: max(na.get(k, 0.0) + sign * nb.get(k, 0.0), 0.0) for k in set(na) | set(nb)}}


def _combined_split(a: Stage, b: Stage, sign: int) -> Dict[str, Any]:
    """The split's fields of two recordings merged (sign +1), or of a window (-1: what `a` added to `b`)."""
    def blockers(x: Mapping[str, int], y: Mapping[str, int]) -> Dict[str, int]:
        out = dict(x)
        for k, v in y.items():
            out[k] = out.get(k, 0) + sign * v
        return {k: v for k, v in out.items() if v > 0}

    return {"cpu_var": max(a.cpu_var + sign * b.cpu_var, 0.0), "cpu_var_self": max(a.cpu_var_self + sign * b.cpu_var_self, 0.0),
            "runqueue": merge_estimate(a.runqueue, b.runqueue, sign), "helpers": merge_estimate(a.helpers, b.helpers, sign),
            "switches": {k: merge_estimate(a.switches.get(k), b.switches.get(k), sign)
                         for k in set(a.switches) | set(b.switches)},
            "loop_total": a.loop_total + sign * b.loop_total, "loop_self": a.loop_self + sign * b.loop_self,
            **_combined_gil(a, b, sign),
            "instrument_total": a.instrument_total + sign * b.instrument_total,
            "instrument_self": a.instrument_self + sign * b.instrument_self,
            "covered_run": a.covered_run + sign * b.covered_run,
            "covered_run_self": a.covered_run_self + sign * b.covered_run_self,
            "loop_blockers": blockers(a.loop_blockers, b.loop_blockers),
            "loop_blockers_waited": blockers(a.loop_blockers_waited, b.loop_blockers_waited)}


def _reads(a: Stage, b: Stage, sign: int) -> Optional[int]:
    """cpu_read_calls of a merge (sign +1) or of a window (-1): None while every call of both was read."""
    if a.cpu_read_calls is None and b.cpu_read_calls is None:
        return None
    return a.cpu_reads + sign * b.cpu_reads


def _sys(x: Optional[int], y: Optional[int], a: Stage, b: Stage) -> Optional[int]:
    """System time of a merge: known only where each side that measured CPU time also split it."""
    if (x is None and y is None) or (x is None and a.cpu_calls) or (y is None and b.cpu_calls):
        return None
    return (x or 0) + (y or 0)


def merge_stage(a: Stage, b: Stage, windows: bool = False) -> Stage:
    """Sums added, histograms merged.  windows=True (merge()): `a` and `b` are
    separate recordings, and the result keeps each one's sums as a window, so a
    comparison can measure the spread between them; otherwise (parts of one
    recording) no windows are kept."""
    def mn(x, y):
        return y if x is None else x if y is None else min(x, y)

    def mx(x, y):
        return y if x is None else x if y is None else max(x, y)

    gpu = a.gpu if b.gpu is None else merge_gpu(a.gpu, b.gpu)
    ops = a.ops if b.ops is None else merge_ops(a.ops, b.ops)
    return a.evolve(calls=a.calls + b.calls, errors=a.errors + b.errors, wall_total=a.wall_total + b.wall_total,
                   wall_self=a.wall_self + b.wall_self, wall_min=mn(a.wall_min, b.wall_min),
                   wall_max=mx(a.wall_max, b.wall_max), cpu_total=sum_known(a.cpu_total, b.cpu_total),
                   cpu_self=sum_known(a.cpu_self, b.cpu_self), cpu_calls=a.cpu_calls + b.cpu_calls,
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
                   ranks=merge_ranks(a.ranks, b.ranks), memory=merge_memory(a.memory, b.memory))


def merge_memory(a: Optional[Mapping[str, Mapping[str, Any]]],
                 b: Optional[Mapping[str, Mapping[str, Any]]]) -> Optional[Dict[str, Dict[str, Any]]]:
    """Memory sums per source added; the largest peak the larger (unknown where a side's is unknown)."""
    if a is None or b is None:
        return None if a is None and b is None else dict(a or b or {})
    out = {k: dict(v) for k, v in a.items()}
    for src, m in b.items():
        if src not in out:
            out[src] = dict(m)
            continue
        x = out[src]
        for k in MEMORY_SUMS:
            x[k] += m[k]
        x["peak_max"] = None if x.get("peak_max") is None or m.get("peak_max") is None else max(x["peak_max"],
                                                                                                   m["peak_max"])
    return out


def _since_memory(a: Optional[Mapping[str, Mapping[str, Any]]],
                  b: Optional[Mapping[str, Mapping[str, Any]]]) -> Optional[Dict[str, Dict[str, Any]]]:
    """The later sums less the earlier; the window's largest peak is known only where it passed the earlier one."""
    if a is None or b is None:
        return None if a is None else {k: dict(v) for k, v in a.items()}
    out: Dict[str, Dict[str, Any]] = {}
    for src, m in a.items():
        e = b.get(src)
        if e is None:
            out[src] = dict(m)
            continue
        x = {k: m[k] - e[k] for k in MEMORY_SUMS}
        if x["calls"] or x["overlapped"]:
            hi, lo = m.get("peak_max"), e.get("peak_max")
            x["peak_max"] = hi if hi is not None and lo is not None and hi > lo else None if x["calls"] else 0.0
            out[src] = x
    return out or None


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


# ------------------------------------------- since: what a later state added
def _since_counters(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for k, v in a.items():
        d, e = dict(v), b.get(k) or {}
        for f in ("total", "self", "enabled_ns", "running_ns", "counted_calls", "read_calls", "var", "var_self"):
            if f in d:
                d[f] = growth(d.get(f), e.get(f))
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


def since_stage(a: Stage, b: Stage) -> Stage:
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
                   cpu_total=growth(a.cpu_total, b.cpu_total) if cpu_calls else None,
                   cpu_self=growth(a.cpu_self, b.cpu_self) if cpu_calls else None, cpu_calls=cpu_calls, hist=h,
                   cpu_read_calls=_reads(a, b, -1),
                   cpu_sys_total=growth(a.cpu_sys_total, b.cpu_sys_total) if cpu_calls else None,
                   cpu_sys_self=growth(a.cpu_sys_self, b.cpu_sys_self) if cpu_calls else None,
                   counters=_since_counters(a.counters, b.counters), gpu=_since_gpu(a.gpu, b.gpu),
                   ops=_since_ops(a.ops, b.ops), verdict=None,
                   overlapped_calls=a.overlapped_calls - b.overlapped_calls,
                   abandoned_calls=a.abandoned_calls - b.abandoned_calls,
                   suspended_total=a.suspended_total - b.suspended_total,
                   suspended_self=a.suspended_self - b.suspended_self, items=_since_items(a.path, a.items, b.items),
                   ranks=since_ranks(a.path, a.ranks, b.ranks), memory=_since_memory(a.memory, b.memory),
                   **_combined_split(a, b, -1))


# -------------------------------------------------------------- exemplars
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


# -------------------------------------------------------------- snapshots
# These read a Snapshot's own meta (`_meta`): its `meta` property is a copy, dear for a merge of many.
def _stamped(s: Stage, meta: Mapping[str, Any]) -> Stage:
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
    return s.evolve(**fields) if fields else s


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


def merge(first: Snap, others: Sequence[Snap]) -> Snap:
    """first.merge(*others): exact for counts and sums; percentiles from the merged histograms."""
    with gc_paused():
        return _merge(first, others)


def _merge(first: Snap, others: Sequence[Snap]) -> Snap:
    stages: Dict[Tuple[str, ...], Stage] = {s.path: _stamped(s, first._meta) for s in first.stages}
    meta = dict(first._meta)
    meta.pop("judged", None)   # merged stages carry no verdicts
    sources = list(meta.get("merged_from") or [_source(meta)])
    events = list(first.events)
    xgroups = [(first.exemplars, first.root_calls())]
    for o in others:
        xgroups.append((o.exemplars, o.root_calls()))
        for s in o.stages:
            s = _stamped(s, o._meta)
            stages[s.path] = merge_stage(stages[s.path], s, windows=True) if s.path in stages else s
        sources.extend(o._meta.get("merged_from") or [_source(o._meta)])
        events.extend(o.events)
        for k in ("start_time", "end_time"):
            a, b = meta.get(k), o._meta.get(k)
            if a is not None and b is not None:
                meta[k] = min(a, b) if k == "start_time" else max(a, b)
        if o._meta.get("exits"):
            exits = meta["exits"] = dict(meta.get("exits") or {})   # a new dict: the sources stay as they were
            for k, v in o._meta["exits"].items():
                exits[k] = exits.get(k, 0) + v
    meta["merged_from"] = sources
    meta.pop(RANK_KEY, None)   # the first process's rank; each source keeps its own
    exemplars = merge_exemplars([g for g in xgroups if g[0]]) if any(g[0] for g in xgroups) else []
    return type(first)(stages.values(), meta, events, exemplars)


def since(later: Snap, earlier: Snap) -> Snap:
    """later.since(earlier): what happened between the two (Snapshot.since says what is kept)."""
    a, b = later._meta, earlier._meta
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
    for s in later.stages:
        old = earlier.get(s.path)
        w = since_stage(s, old) if old is not None else s
        if w.calls or w.wall_total or w.items:
            stages.append(replace(w, windows=None) if merged else w)
    for old in earlier.stages:
        if old.calls and later.get(old.path) is None:
            raise SnapshotError(f"since: stage {path_text(old.path)} is in the earlier snapshot only: not an earlier "
                                "state of this one")
    meta = dict(a)
    meta.pop("judged", None)   # a window's stages carry no verdicts
    meta["window"] = {"start_time": b.get("end_time"), "end_time": a.get("end_time"),
                      "duration_ns": None if merged else (a.get("duration_ns") or 0) - (b.get("duration_ns") or 0)}
    if merged:
        return type(later)(stages, meta)
    events = [e for e in later.events if (e.get("ts_ns") or 0) >= (b.get("duration_ns") or 0)]
    # the calls kept now that started in the window (the store keeps the slowest since the start, so a
    # window's slowest calls are there unless slower ones came before them)
    exemplars = [e for e in later.exemplars if e["start_ns"] >= (b.get("duration_ns") or 0)]
    return type(later)(stages, meta, events, exemplars)


def merge_all(snaps: Iterable[Snap], progress: Optional[Callable[[int], None]] = None) -> Snap:
    """The exact merge of snapshots (Snapshot.merge), one at a time; timeline events and exemplars keep
    their process (`pid`) and are put on the merged snapshot's time base; a snapshot that names its rank
    is a merge of one (its figures per rank).  progress(k) after the k-th."""
    acc: Optional[Snap] = None
    events: List[Dict[str, Any]] = []
    for k, s in enumerate(snaps, 1):
        m = s.meta   # a copy: merging never touches the snapshots merged
        base = round((m.get("start_time") or 0) * 1e9)
        events += [dict(e, pid=e.get("pid", m.get("pid")), ts_ns=e["ts_ns"] + base) for e in s.events]
        bare = type(s)(s.stages, m, None, [dict(e, pid=e.get("pid", m.get("pid")), start_ns=e["start_ns"] + base)
                                           for e in s.exemplars])
        acc = (bare.merge() if rank_of(m) is not None else bare) if acc is None else acc.merge(bare)
        if progress:
            progress(k)
    if acc is None:
        raise SnapshotError("no snapshot files given")
    t0 = round((acc._meta.get("start_time") or 0) * 1e9)
    return type(acc)(acc.stages, acc._meta, [dict(e, ts_ns=e["ts_ns"] - t0) for e in events],
                     [dict(e, start_ns=e["start_ns"] - t0) for e in acc.exemplars])
