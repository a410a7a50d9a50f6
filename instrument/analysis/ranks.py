"""The ranks of a torch.distributed job side by side, and who is the straggler.

A pure function of a Snapshot whose stages carry per-rank figures (StageStats.ranks: a merge of
snapshots that name their rank, as instrument.distributed.gather, `instrument merge --by-rank` and
`instrument run` of a torchrun job make).

- Per step: a stage's time on a rank divided by that rank's steps, the calls of the stage's top-level
  stage on it (collectives keep the ranks in step, so a rank's k-th step is everyone's k-th).
- Per stage: the spread of its time per step over the ranks that ran it (min / median / max) and the
  slowest rank.  For a collective, each rank's wait: its time per step beyond the fastest rank's (the
  rank that arrived last waits least: its time is the transfer's own).  Collectives are measured on
  the device where every rank has device time (an NCCL call returns at once; its stream waits).
- The straggler: among the stages that are not collectives, the one where a rank's own (self) time per
  step exceeds the median of the other ranks' by the most; the wait it caused is what each other rank
  spent per step in the first collective after it (in the same top-level stage, the next step's when
  none follows) beyond the straggler's own time there.
- Ranks below the world size with no data are missing; a rank that completed fewer steps (calls of the
  main top-level stage that did not raise) than the most any rank did stopped early (killed, crashed, or
  not finished when its snapshot was taken).  Calls that raised are listed per stage and rank (a
  collective raises on the ranks left when a peer dies).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..snapshot import Snapshot, StageStats, as_path, is_collective, path_text


@dataclass(frozen=True)
class StageAcrossRanks:
    """One stage on every rank that ran it; times in ns per step."""
    path: Tuple[str, ...]
    collective: bool
    device: bool                       # per_step is device time (collectives where every rank has it)
    calls: Dict[int, int]
    per_step: Dict[int, float]
    self_per_step: Dict[int, float]
    low: float
    median: float
    high: float
    slowest: int
    wait: Optional[Dict[int, float]]   # collectives: each rank's time per step beyond the fastest rank's

    @property
    def mean_wait(self) -> Optional[float]:
        return statistics.fmean(self.wait.values()) if self.wait else None


@dataclass(frozen=True)
class Straggler:
    rank: int
    path: Tuple[str, ...]
    excess_ns: float                    # its self time per step beyond the median of the other ranks'
    step_share: Optional[float]         # excess_ns / the median rank's time per step of the top-level stage
    collective: Optional[Tuple[str, ...]]   # the collective after it where the others waited
    waits: Dict[int, float]             # each other rank's time per step there beyond the straggler's own

    @property
    def wait_ns(self) -> Optional[float]:
        """The median of the other ranks' waits per step."""
        return statistics.median(self.waits.values()) if self.waits else None


@dataclass(frozen=True)
class RankView:
    world_size: Optional[int]
    ranks: Tuple[int, ...]              # ranks with data
    missing: Tuple[int, ...]            # ranks below the world size without data
    hosts: Dict[int, str]
    steps: Dict[int, int]               # per rank, completed calls of the main top-level stage (most time)
    stopped: Tuple[int, ...]            # ranks with fewer steps than the most
    failed: Dict[Tuple[str, ...], Dict[int, int]]   # stage -> rank -> calls that raised
    step_path: Optional[Tuple[str, ...]]
    stages: Tuple[StageAcrossRanks, ...]
    straggler: Optional[Straggler]

    def stage(self, path) -> StageAcrossRanks:
        key = as_path(path)
        for s in self.stages:
            if s.path == key:
                return s
        raise KeyError(f"no stage {path_text(key)!r} across ranks")

    def to_dict(self) -> Dict[str, Any]:
        def by_rank(d: Optional[Dict[int, float]]) -> Optional[Dict[str, float]]:
            return None if d is None else {str(r): round(v) for r, v in sorted(d.items())}
        s = self.straggler
        return {
            "world_size": self.world_size, "ranks": list(self.ranks), "missing": list(self.missing),
            "hosts": {str(r): h for r, h in sorted(self.hosts.items())},
            "steps": {str(r): n for r, n in sorted(self.steps.items())}, "stopped": list(self.stopped),
            "failed": {path_text(p): {str(r): n for r, n in sorted(d.items())} for p, d in self.failed.items()},
            "step_stage": None if self.step_path is None else path_text(self.step_path),
            "straggler": None if s is None else {
                "rank": s.rank, "stage": path_text(s.path), "excess_ns_per_step": round(s.excess_ns),
                "step_share": None if s.step_share is None else round(s.step_share, 4),
                "collective": None if s.collective is None else path_text(s.collective),
                "wait_ns_per_step": None if s.wait_ns is None else round(s.wait_ns),
                "waits_ns_per_step": by_rank(s.waits)},
            "stages": [{"stage": path_text(x.path), "collective": x.collective, "device": x.device,
                        "calls": {str(r): n for r, n in sorted(x.calls.items())},
                        "ns_per_step": by_rank(x.per_step), "self_ns_per_step": by_rank(x.self_per_step),
                        "min_ns": round(x.low), "median_ns": round(x.median), "max_ns": round(x.high),
                        "slowest_rank": x.slowest, "wait_ns_per_step": by_rank(x.wait)} for x in self.stages],
        }


def rank_view(snap: Snapshot) -> RankView:
    """The ranks of `snap` side by side; ValueError when its stages have no per-rank figures."""
    ranked = [s for s in snap.stages if s.ranks]
    if not ranked:
        raise ValueError("the snapshot has no per-rank figures: it was not merged from snapshots that name their "
                         "rank (instrument.distributed.gather, `instrument merge --by-rank`, or `instrument run` "
                         "of a torchrun job)")
    sources = [m for m in snap.meta.get("merged_from") or [] if isinstance(m.get("rank"), int)]
    present = sorted({r for s in ranked for r in s.ranks} | {m["rank"] for m in sources})
    sizes = [m["world_size"] for m in sources if isinstance(m.get("world_size"), int)]
    world = max(sizes) if sizes else None
    missing = tuple(r for r in range(world) if r not in present) if world else ()
    roots = {s.path: s for s in ranked if len(s.path) == 1}
    main = max(roots.values(), key=lambda s: sum(f["wall_ns"] for f in s.ranks.values()), default=None)
    done = {r: f["calls"] - f["errors"] for r, f in main.ranks.items()} if main is not None else {}
    steps = {r: done.get(r, 0) for r in present} if main is not None else {}
    most = max(steps.values(), default=0)
    rows = [_across(s, roots.get(s.path[:1])) for s in ranked]
    rows = [x for x in rows if x is not None]
    return RankView(world_size=world, ranks=tuple(present), missing=missing,
                    hosts={m["rank"]: m.get("host") for m in sources},
                    steps=steps, stopped=tuple(r for r, n in steps.items() if n < most),
                    failed={s.path: {r: f["errors"] for r, f in sorted(s.ranks.items()) if f["errors"]}
                            for s in ranked if any(f["errors"] for f in s.ranks.values())},
                    step_path=None if main is None else main.path, stages=tuple(rows),
                    straggler=_straggler(snap, rows, roots))


def _steps(s: StageStats, root: Optional[StageStats], rank: int) -> int:
    n = ((root.ranks or {}).get(rank) or {}).get("calls", 0) if root is not None else 0
    return n or s.ranks[rank]["calls"]


def _across(s: StageStats, root: Optional[StageStats]) -> Optional[StageAcrossRanks]:
    ran = {r: f for r, f in s.ranks.items() if f["calls"]}
    if not ran:
        return None
    collective = is_collective(s.name)
    device = collective and all(f.get("gpu_ns") is not None for f in ran.values())
    per, own = {}, {}
    for r, f in ran.items():
        n = _steps(s, root, r)
        per[r] = (f["gpu_ns"] if device else f["wall_ns"]) / n
        own[r] = (f["gpu_ns"] if device else f["self_ns"]) / n
    low = min(per.values())
    return StageAcrossRanks(path=s.path, collective=collective, device=device,
                            calls={r: f["calls"] for r, f in ran.items()}, per_step=per, self_per_step=own,
                            low=low, median=statistics.median(per.values()), high=max(per.values()),
                            slowest=max(sorted(per), key=per.__getitem__),
                            wait={r: v - low for r, v in per.items()} if collective else None)


def _straggler(snap: Snapshot, rows: List[StageAcrossRanks],
               roots: Dict[Tuple[str, ...], StageStats]) -> Optional[Straggler]:
    excess = {}
    for x in rows:
        if not x.collective and len(x.self_per_step) > 1:
            r = max(sorted(x.self_per_step), key=x.self_per_step.__getitem__)
            others = statistics.median(v for k, v in x.self_per_step.items() if k != r)
            excess[x.path] = (x.self_per_step[r] - others, r, x)
    if not excess:
        return None
    gap, rank, x = max(excess.values(), key=lambda e: e[0])
    if gap <= 0:
        return None
    after = _following_collective(snap, x.path, {y.path: y for y in rows})
    waits = {}
    if after is not None and rank in after.per_step:
        waits = {r: max(v - after.per_step[rank], 0.0) for r, v in after.per_step.items() if r != rank}
    root = roots.get(x.path[:1])
    step = statistics.median(root.ranks[r]["wall_ns"] / root.ranks[r]["calls"]
                             for r in root.ranks if root.ranks[r]["calls"]) if root is not None else None
    return Straggler(rank=rank, path=x.path, excess_ns=gap, step_share=gap / step if step else None,
                     collective=None if after is None else after.path, waits=waits)


def _following_collective(snap: Snapshot, path: Tuple[str, ...],
                          rows: Dict[Tuple[str, ...], StageAcrossRanks]) -> Optional[StageAcrossRanks]:
    """The first collective after the stage and its children in the same top-level stage; the next step's
    first when none follows in this one."""
    order = [s.path for s in snap.stages if s.path[:1] == path[:1] and s.path in rows]
    k = order.index(path)
    outside = [p for p in order[k + 1:] + order[:k] if p[:len(path)] != path]
    return next((rows[p] for p in outside if rows[p].collective), None)
