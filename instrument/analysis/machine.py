"""The machine each side of a diff ran on, as far as its snapshot says, and whether the two differed.

A snapshot holds three signs of its machine: how much of the stages' running time they spent ready
but waiting for a CPU (the run queue: other work on the machine), or, where that was not measured,
their involuntary context switches; the speed of a fixed reference loop, timed on the stages' threads
through the recording (the machine probe) and when recording started (`meta.machine`, docs/schema.md);
and the load average when it was taken.  Wall time moves with the first two; CPU time per call moves
with the second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..snapshot import Snapshot, StageStats, path_shown

WAITING_POINTS = 0.05     # shares of running time spent waiting for a CPU further apart than this: machines differed
SPEED_CHANGE = 0.10       # reference loops further apart than this (relative): machines of different speed
SWITCHES_RATIO = 2.0      # without run-queue time: involuntary switches per second this many times apart,
SWITCHES_MIN = 20.0       # and more than this many per second on the busier side


def waiting(s: StageStats) -> Optional[float]:
    """Share of the stage's running time it spent ready but waiting for a CPU; None where not measured."""
    if s.runqueue is None or not s.covered_run:
        return None
    return min(1.0, s.runqueue["total"] / s.covered_run)


@dataclass(frozen=True)
class Machine:
    waiting: Optional[float]              # share of the top-level stages' running time waiting for a CPU
    switches_per_s: Optional[float]       # their involuntary context switches per second of running time
    reference_ns: Optional[float]         # the reference loop's ns per iteration (the median over the runs)
    load: Optional[float]                 # load average when the snapshot was taken (the mean over the runs)
    probe_ns: Optional[float] = None      # the machine probe's ns per iteration through the recording

    def to_dict(self) -> Dict[str, Any]:
        return {"waiting": self.waiting, "involuntary_switches_per_s": self.switches_per_s,
                "reference_ns": self.reference_ns, "probe_ns": self.probe_ns, "load": self.load}


def _median(xs: List[float]) -> Optional[float]:
    xs = sorted(xs)
    if not xs:
        return None
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else (xs[k - 1] + xs[k]) / 2


def _machines(meta: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """meta.machine of every source of a snapshot (each merged source keeps its own)."""
    sources = meta.get("merged_from") or [meta]
    return [m for m in (s.get("machine") for s in sources if isinstance(s, Mapping)) if isinstance(m, Mapping)]


def machine(snap: Snapshot) -> Machine:
    roots = [s for s in snap.roots if s.calls]
    covered = [s for s in roots if s.runqueue is not None and s.covered_run]
    share = (sum(s.runqueue["total"] for s in covered) / sum(s.covered_run for s in covered)) if covered else None
    running = sum(max(s.wall_total - s.suspended_total, 0) for s in roots)
    counted = [s.switches["involuntary"]["total"] for s in roots if s.switches.get("involuntary")]
    switches = sum(counted) / (running / 1e9) if counted and running else None
    ms = _machines(snap.meta)
    refs = [float(m["reference_ns"]) for m in ms if isinstance(m.get("reference_ns"), (int, float))]
    loads = [float(m["load"]) for m in ms if isinstance(m.get("load"), (int, float))]
    return Machine(None if share is None else min(1.0, share), switches, _median(refs),
                   sum(loads) / len(loads) if loads else None, _probe(ms))


def _probe(ms: List[Mapping[str, Any]]) -> Optional[float]:
    """The machine probe's ns per iteration over every source, their means weighed by their timings kept; None
    where a source has none."""
    ps = [m.get("probe") for m in ms]
    if not ps or not all(isinstance(p, Mapping) and isinstance(p.get("ns"), (int, float)) and p["ns"] > 0
                         and isinstance(p.get("kept"), int) and p["kept"] > 0 for p in ps):
        return None
    return sum(p["ns"] * p["kept"] for p in ps) / sum(p["kept"] for p in ps)


@dataclass(frozen=True)
class Common:
    """The change of CPU time per call that a snapshot's stages share: the median, over the members (each stage
    that holds no other, its CPU time per call well measured on both sides), of the log of after over before.
    Where most members' code did not change, it is the machine's change of speed.  With several runs a side it is
    found in each run (`runs`): each run's machine is taken out of that run's figures."""
    change: float                         # the median of the members' log changes
    members: Tuple[str, ...]              # their path texts
    changes: Tuple[float, ...]            # each member's log change
    spread: float                         # the members' spread about the median (1.4826 × their MAD, log scale)
    runs: Tuple[Tuple[float, float, float], ...] = ()   # several runs a side: (start, end, level) of each run, its
                                          # level the median of the members' logs less their means before; `change`
                                          # the mean level after less the mean level before
    pooled: Tuple[float, int] = (0.0, 0)  # several runs a side: the members' logs less their runs' levels, their
                                          # squares about each side's mean summed, and the degrees of freedom

    def to_dict(self) -> Dict[str, Any]:
        return {"change": math.expm1(self.change), "spread": self.spread,
                "members": {m: math.expm1(c) for m, c in zip(self.members, self.changes)},
                "runs": [{"start_time": s, "end_time": e, "level": math.expm1(c)} for s, e, c in self.runs] or None}

    def text(self) -> str:
        """"the stages' CPU time per call moved +4 % in their median (3 stages that hold no other), taken as the
        machine's change of speed"."""
        pct = math.expm1(self.change)
        return (f"the stages' CPU time per call moved {'+' if pct >= 0 else '−'}{abs(100 * pct):.0f} % in their "
                f"median ({len(self.members)} stages that hold no other), taken as the machine's change of speed")


@dataclass(frozen=True)
class Comparison:
    before: Machine
    after: Machine
    differed: bool
    line: str                             # one line with the figures, for the diff's output
    speed_change: Optional[float]         # after's reference stage, the stages' common change, probe or reference
                                          # loop time / before's - 1 (+0.2: after 20 % slower)
    common: Optional[Common] = None       # the stages' common change, where it is taken as the machine's

    def to_dict(self) -> Dict[str, Any]:
        return {"differed": self.differed, "line": self.line, "speed_change": self.speed_change,
                "common": self.common.to_dict() if self.common is not None else None,
                "before": self.before.to_dict(), "after": self.after.to_dict()}


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.01 or x == 0 else f"{100 * x:.1g} %"


def _shared(speed: float, stages: Optional[float]) -> Tuple[Optional[float], str]:
    """The part of a loop's change of speed (relative) that the stages' own CPU time per call shares (`stages`: the
    median log change of those that hold no other), and the words that say so.  Where they did not move the same
    way by at least half as much (log scale), the loop strayed (beside a hog the probe ran up to 71 % slower where
    the stages' CPU time moved a few %) and none of it is taken: no stage's change is put down to the machine on
    the loop's word alone."""
    probe = math.log1p(speed)
    if stages is None or abs(stages) >= abs(probe) and stages * probe > 0:
        return speed, ""
    moved = f" (their median moved {'+' if stages >= 0 else '−'}{_pct(abs(math.expm1(stages)))})"
    if stages * probe > 0 and abs(stages) >= abs(probe) / 2:
        return math.expm1(stages), f", which the stages' own CPU time per call shares in part{moved}: that part " \
                                   "is taken as the machine's change of speed"
    return None, f", which the stages' own CPU time per call does not share{moved}: it is not taken as the " \
                 "machine's change of speed"


def compare(before: Snapshot, after: Snapshot, reference: Optional[Tuple[StageStats, StageStats]] = None,
            common: Optional[Common] = None, stages: Optional[float] = None) -> Comparison:
    """Whether the two snapshots' machines differed, and the line that says so with the figures, e.g.
    "the machines differed: after spent 38 % of its running time waiting for a CPU, before 2 %: wall-time
    changes are not evidence".  `reference`: a stage (before, after) whose code did not change: its change of
    CPU time per call is the machine's change of speed, in place of the probe's or the reference loop's;
    `common`: the stages' common change, taken so where no reference stage is named; `stages`: the median log
    change of CPU time per call of the stages that hold no other, where the loops' change is to be cut to it."""
    b, a = machine(before), machine(after)
    facts: List[Tuple[bool, str]] = []
    if b.waiting is not None and a.waiting is not None:
        facts.append((abs(a.waiting - b.waiting) > WAITING_POINTS,
                      f"after spent {_pct(a.waiting)} of its running time waiting for a CPU, before {_pct(b.waiting)}"))
    elif b.switches_per_s is not None and a.switches_per_s is not None:
        lo, hi = sorted((b.switches_per_s, a.switches_per_s))
        facts.append((hi > SWITCHES_MIN and hi > SWITCHES_RATIO * lo,
                      f"after was preempted {a.switches_per_s:.0f} times per second of running time, before "
                      f"{b.switches_per_s:.0f}"))
    speed = None
    if reference is not None:
        rb, ra = (s.cpu_total / s.cpu_calls for s in reference)
        speed = ra / rb - 1
        facts.append((abs(speed) > SPEED_CHANGE,
                      f"the reference stage {path_shown(reference[0].path)} took {'+' if speed >= 0 else '−'}"
                      f"{abs(100 * speed):.0f} % CPU time per call, taken as the machine's change of speed"))
    elif b.probe_ns and a.probe_ns:
        loop = a.probe_ns / b.probe_ns - 1
        speed, cut = _shared(loop, stages)
        facts.append((abs(loop) > SPEED_CHANGE,
                      f"its probe loop took {a.probe_ns:.1f} ns per iteration through the run, before "
                      f"{b.probe_ns:.1f} ({'+' if loop >= 0 else '−'}{abs(100 * loop):.0f} %){cut}"))
    elif b.reference_ns and a.reference_ns and common is None:
        loop = a.reference_ns / b.reference_ns - 1
        speed, cut = _shared(loop, stages)
        facts.append((abs(loop) > SPEED_CHANGE,
                      f"its reference loop took {a.reference_ns:.1f} ns per iteration, before {b.reference_ns:.1f} "
                      f"({'+' if loop >= 0 else '−'}{abs(100 * loop):.0f} %){cut}"))
    if common is not None and reference is None:
        speed = math.expm1(common.change)
        facts.append((abs(speed) > SPEED_CHANGE, common.text()))
    described = bool(facts)
    if b.load is not None and a.load is not None:
        facts.append((False, f"load {a.load:.1f}, before {b.load:.1f}"))
    if not described:
        return Comparison(b, a, False, "the snapshots do not describe their machines (no run-queue time, context "
                          "switches or reference loop): wall-time changes are taken as evidence", None)
    text = "; ".join(t for _, t in facts)
    if any(d for d, _ in facts):
        return Comparison(b, a, True, f"the machines differed: {text}: wall-time changes are not evidence", speed,
                          common)
    return Comparison(b, a, False, f"the machines were alike: {text}", speed, common)
