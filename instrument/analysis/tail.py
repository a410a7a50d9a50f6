"""Why slow requests are slow: the tail of each root stage, stage by stage.

A snapshot keeps, per root stage (a request), exemplars: the K slowest calls and a
uniform sample of typical calls, each with the self time of every stage beneath
the root in that call (`Snapshot.exemplars`).  For a root stage:

- the slow calls are the kept calls at or above its quantile Q (p99 by default,
  from the root's histogram);
- the typical call is the mean breakdown of the middle half (25th to 75th
  percentile by wall time) of the sampled calls: a median request;
- each stage's excess is its mean self time over the slow calls less its mean
  self time in the typical call; its share is that excess over the total excess
  (the slow calls' mean wall time less the typical one's), so the shares add up
  to 1 and the stage that holds the tail comes first;
- each stage's excess is split by component (on a CPU, in the run queue, blocked,
  awaiting, waiting for the event loop) from the kept calls' own splits, so a tail
  reads as one sentence: "slow calls of request are 96 ms slower than a typical
  one; 80 % of that is io waiting for the event loop, which burst held".

Pure functions of a Snapshot, like the rest of `instrument.analysis`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..snapshot import EXEMPLAR_SPLIT, Snapshot, StageStats

Path = Tuple[str, ...]
MEM_EXCESS = 1 << 20   # a memory peak the slow calls hold above the typical call's, from which the sentence names it
PARTS = ("on_cpu", "runqueue", "blocked", "gil", "awaiting", "loop_ready", "unknown")   # a kept call's self time
PART_TEXT = {"on_cpu": "on a CPU", "runqueue": "waiting for a CPU (run queue)", "blocked": "blocked (I/O, locks, sleep)",
             "gil": "waiting for the GIL",
             "awaiting": "awaiting", "loop_ready": "waiting for the event loop",
             "unknown": "off the CPU part of the time, in calls left unread (run queue or blocked)"}


@dataclass(frozen=True)
class Excess:
    path: Path
    ns: float                 # mean self time over the slow calls less the typical call's
    share: Optional[float]    # of the total excess; None when the slow calls are no slower than typical ones
    slow_ns: float            # mean self time over the slow calls
    typical_ns: float         # self time in the typical call
    parts: Mapping[str, float] = None   # the excess by component (PARTS): slow calls' mean less the typical's
    # the resident set's peak above a call's start (its largest in a kept call), mean over the kept calls that
    # measured it: slow and typical; None where none did
    slow_mem: Optional[float] = None
    typical_mem: Optional[float] = None

    @property
    def mem_excess(self) -> Optional[float]:
        """Bytes the slow calls' memory peak is above the typical call's; None where either is not measured."""
        return None if self.slow_mem is None or self.typical_mem is None else self.slow_mem - self.typical_mem

    @property
    def component(self) -> Optional[str]:
        """The component that holds most of the excess; None when nothing grew."""
        grew = [(v, p) for p, v in (self.parts or {}).items() if v > 0]
        return max(grew)[1] if grew else None

    def to_dict(self) -> Dict[str, Any]:
        return {"path": list(self.path), "ns": self.ns, "share": self.share, "slow_ns": self.slow_ns,
                "typical_ns": self.typical_ns, "parts_ns": dict(self.parts or {}), "component": self.component,
                "slow_mem_peak_bytes": self.slow_mem, "typical_mem_peak_bytes": self.typical_mem}


@dataclass(frozen=True)
class TailView:
    stage: Path                       # the root stage
    quantile: float
    calls: int                        # calls of the root stage
    p50_ns: Optional[float]
    p99_ns: Optional[float]
    threshold_ns: Optional[float]     # the root's wall time at `quantile`
    slow_calls: int                   # kept calls at or above the threshold
    typical_calls: int                # sampled calls the typical breakdown is the mean of
    slow_mean_ns: Optional[float]
    typical_mean_ns: Optional[float]
    excess: Tuple[Excess, ...]        # largest first

    @property
    def total_excess_ns(self) -> Optional[float]:
        if self.slow_mean_ns is None or self.typical_mean_ns is None:
            return None
        return self.slow_mean_ns - self.typical_mean_ns

    def share(self, path: Sequence[str], inclusive: bool = True) -> Optional[float]:
        """The share of the excess held by the stage at `path` (with the stages under it when inclusive)."""
        p = tuple(path)
        rows = [e for e in self.excess if (e.path[:len(p)] == p if inclusive else e.path == p)]
        if not rows or any(e.share is None for e in rows):
            return None
        return sum(e.share for e in rows)   # type: ignore[misc]

    def own_mem_excess(self, e: "Excess") -> Optional[float]:
        """A stage's memory excess beyond its child stages' (a peak holds its children's): its own, or None."""
        if e.mem_excess is None:
            return None
        kids = [k.mem_excess for k in self.excess if len(k.path) == len(e.path) + 1 and k.path[:-1] == e.path
                and k.mem_excess is not None]
        return e.mem_excess - max(kids, default=0.0)

    def sentence(self, snap: Optional[Snapshot] = None) -> Optional[str]:
        """Why the slow calls are slow, in one sentence: the stage that holds most of the excess and the component
        of its time that grew (with the stages that held the event loop, from `snap`, where that was it)."""
        total = self.total_excess_ns
        top = next((e for e in self.excess if e.ns > 0), None)
        if total is None or total <= 0 or top is None:
            return None
        root = "/".join(self.stage)
        text = (f"slow calls of {root} (≥ p{self.quantile * 100:g}) are {total / 1e6:.3g} ms slower than a typical one; "
                f"{top.share:.0%} of that is {'/'.join(top.path)}")
        c = top.component
        if c is not None:
            text += f" {PART_TEXT[c]} (+{top.parts[c] / 1e6:.3g} ms)"
            st = snap.get(top.path) if snap is not None else None
            if c == "loop_ready" and st is not None and st.loop_blockers:
                held = sorted(st.loop_blockers.items(), key=lambda kv: -kv[1])[:2]
                text += ", while " + " and ".join(p for p, _ in held) + " held the loop"
        grew = self.own_mem_excess(top)
        if grew is not None and grew >= MEM_EXCESS:
            text += (f"; its memory peak per call is {top.slow_mem / 2 ** 20:.1f} MiB in them against "
                     f"{top.typical_mem / 2 ** 20:.1f} in a typical one (fresh resident pages)")
        return text

    def to_dict(self) -> Dict[str, Any]:
        return {"stage": list(self.stage), "quantile": self.quantile, "calls": self.calls, "p50_ns": self.p50_ns,
                "p99_ns": self.p99_ns, "threshold_ns": self.threshold_ns, "slow_calls": self.slow_calls,
                "typical_calls": self.typical_calls, "slow_mean_ns": self.slow_mean_ns,
                "typical_mean_ns": self.typical_mean_ns, "excess_ns": self.total_excess_ns,
                "excess": [e.to_dict() for e in self.excess]}


def _mean_breakdown(calls: Sequence[Mapping[str, Any]]) -> Dict[Path, float]:
    acc: Dict[Path, float] = {}
    for e in calls:
        for b in e["breakdown"]:
            p = tuple(b["path"])
            acc[p] = acc.get(p, 0.0) + b["wall_ns"]
    return {p: v / len(calls) for p, v in acc.items()} if calls else {}


def _parts(b: Mapping[str, Any]) -> Dict[str, float]:
    """A kept call's self time of one stage by component: blocked is what the others leave of it; all of it
    unknown where the call's split was not measured."""
    split = b.get("split") or {}
    if any(split.get(k) is None for k in EXEMPLAR_SPLIT):
        return {"unknown": float(b["wall_ns"])}
    out = {k: float(split[k]) for k in EXEMPLAR_SPLIT}
    if split.get("gil") is not None:   # sampled in the call: out of blocked
        out["gil"] = float(split["gil"])
    out["blocked"] = max(float(b["wall_ns"]) - sum(out.values()), 0.0)
    return out


def _mean_parts(calls: Sequence[Mapping[str, Any]]) -> Dict[Path, Dict[str, float]]:
    acc: Dict[Path, Dict[str, float]] = {}
    for e in calls:
        for b in e["breakdown"]:
            d = acc.setdefault(tuple(b["path"]), {})
            for k, v in _parts(b).items():
                d[k] = d.get(k, 0.0) + v
    return {p: {k: v / len(calls) for k, v in d.items()} for p, d in acc.items()} if calls else {}


def _mean_mem(calls: Sequence[Mapping[str, Any]]) -> Dict[Path, float]:
    """Per stage, the mean of its memory peak over the kept calls that measured it."""
    acc: Dict[Path, List[float]] = {}
    for e in calls:
        for b in e["breakdown"]:
            if b.get("mem_peak_bytes") is not None:
                acc.setdefault(tuple(b["path"]), []).append(float(b["mem_peak_bytes"]))
    return {p: sum(v) / len(v) for p, v in acc.items()}


def _typical(samples: List[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The middle half of the sampled calls by wall time (all of them when there are fewer than four)."""
    s = sorted(samples, key=lambda e: e["wall_ns"])
    if len(s) < 4:
        return s
    return s[len(s) // 4: len(s) - len(s) // 4]


def tail_of(snap: Snapshot, root: str, quantile: float = 0.99) -> Optional[TailView]:
    """The tail view of one root stage; None when the snapshot kept no exemplars of it."""
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be between 0 and 1 (exclusive), got {quantile!r}")
    ex = [e for e in snap.exemplars if e["path"][0] == root]
    st = snap.get((root,))
    if not ex or st is None:
        return None
    threshold = st.quantile(quantile) if st.calls else None
    uniq: Dict[tuple, Mapping[str, Any]] = {}
    for e in ex:
        uniq.setdefault((e.get("pid"), e.get("seq"), e.get("start_ns"), e["wall_ns"]), e)
    calls = list(uniq.values())
    slow = [e for e in calls if threshold is not None and e["wall_ns"] >= threshold]
    if not slow:   # the root's quantile is above every kept call (a window without its slowest calls)
        slow = [max(calls, key=lambda e: e["wall_ns"])]
    typical = _typical([e for e in calls if e.get("sample")])
    s_mean, t_mean = _mean_breakdown(slow), _mean_breakdown(typical)
    s_parts, t_parts = _mean_parts(slow), _mean_parts(typical)
    s_mem, t_mem = _mean_mem(slow), _mean_mem(typical)
    slow_wall = sum(e["wall_ns"] for e in slow) / len(slow)
    typ_wall = sum(e["wall_ns"] for e in typical) / len(typical) if typical else None
    total = slow_wall - typ_wall if typ_wall is not None else None
    rows = []
    for p in list(dict.fromkeys(list(s_mean) + list(t_mean))):
        a, b = s_mean.get(p, 0.0), t_mean.get(p, 0.0)
        d = a - b if typ_wall is not None else a
        share = (d / total) if total is not None and total > 0 else None
        sp, tp = s_parts.get(p, {}), t_parts.get(p, {}) if typ_wall is not None else {}
        parts = {k: sp.get(k, 0.0) - tp.get(k, 0.0) for k in PARTS if k in sp or k in tp}
        rows.append(Excess(p, d, share, a, b, parts, s_mem.get(p), t_mem.get(p) if typ_wall is not None else None))
    rows.sort(key=lambda r: (-r.ns, r.path))
    p50, p99 = (st.quantile(0.5), st.quantile(0.99)) if st.calls else (None, None)
    return TailView(stage=(root,), quantile=quantile, calls=st.calls, p50_ns=p50, p99_ns=p99, threshold_ns=threshold,
                    slow_calls=len(slow), typical_calls=len(typical), slow_mean_ns=slow_wall, typical_mean_ns=typ_wall,
                    excess=tuple(rows))


def tail(snap: Snapshot, quantile: float = 0.99) -> List[TailView]:
    """The tail view of every root stage with exemplars, the roots with the most time first."""
    views = []
    for r in sorted(snap.roots, key=lambda s: -s.wall_total):
        v = tail_of(snap, r.name, quantile)
        if v is not None:
            views.append(v)
    return views


_last: Tuple[Optional[Snapshot], Dict[str, TailView]] = (None, {})   # the last snapshot asked about, its views


def share_of_excess(snap: Snapshot, s: StageStats) -> Optional[float]:
    """The stage's share (with the stages under it) of its root stage's p99 excess; None without exemplars.
    A table asks for every stage of one snapshot in turn, so the views of the last one are kept."""
    global _last
    if not snap.exemplars:
        return None
    seen, views = _last
    if seen is not snap:
        views = {v.stage[0]: v for v in tail(snap)}
        _last = (snap, views)
    v = views.get(s.path[0])
    return v.share(s.path) if v is not None else None
