"""The ranks of a torch.distributed job in snapshots: which rank a snapshot recorded, the names of the collective
stages the SDK times, and each stage's figures per rank, merged and windowed as the stage's own are.

A process of a job names itself in meta["distributed"] ({"rank", "world_size", "local_rank", "host", ...});
merge() keeps each stage's figures per rank (StageStats.ranks) and each source's rank in meta.merged_from.
Collectives timed by the SDK are stages named COLLECTIVE_PREFIX + the torch.distributed function."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from .base import SnapshotError, growth, path_text, sum_known

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


def rank_figures(s: Any) -> Dict[str, Any]:
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
        out[r] = {k: sum_known(out[r].get(k), f.get(k)) for k in RANK_FIELDS} if r in out else dict(f)
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
        w = dict(f) if e is None else {k: growth(f.get(k), e.get(k)) for k in RANK_FIELDS}
        if w["calls"]:
            out[r] = w
    return out

