"""One view of a torch.distributed job: every rank's stages, and who is the straggler.

    import instrument, instrument.distributed

    for step in range(steps):
        with instrument.stage("step"):
            with instrument.stage("preprocess"): ...
            torch.distributed.all_reduce(grad)      # timed as the child stage step/dist.all_reduce
    snap = instrument.distributed.gather(dst=0)     # on rank 0: every rank's stages, per rank; None elsewhere
    if snap is not None:
        print(instrument.distributed.ranks(snap).straggler)

The live side is instrument.live.distributed; the view is instrument.analysis.ranks.
"""
from __future__ import annotations

from typing import Any, Optional

from .analysis.ranks import RankView, rank_view as ranks
from .analysis.verdict import with_verdicts
from .live import collector as _collector
from .live import distributed as _live
from .snapshot import Snapshot


def gather(dst: int = 0, group: Any = None) -> Optional[Snapshot]:
    """Every rank's snapshot, merged on rank `dst` with each stage's figures per rank (rank, world size,
    local rank and host of each in meta.merged_from), with verdicts; None on the other ranks.  A
    collective: every rank calls it.  It sends CPU tensors over the job's group, or over a gloo group
    made once for it when the job's backend is NCCL (no GPU memory is used)."""
    snap = _live.gather(lambda: _collector.snapshot(judged=False), dst, group)
    return None if snap is None else with_verdicts(snap)


def identity() -> dict:
    """{"rank", "world_size", "local_rank", "backend", "source"} of this process (rank None outside a job)."""
    return _live.identity()


__all__ = ["gather", "ranks", "identity", "RankView"]
