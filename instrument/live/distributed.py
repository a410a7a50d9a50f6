"""torch.distributed: which rank this process is, its collectives timed as stages, and gather().

An integration (instrument.live.integrations) from the start, so a process a launcher started names its
rank; its collectives are installed by torchwatch once torch is imported.  Never imports torch itself.

- The rank: while torch.distributed's default group is up, its rank and world size (remembered after
  the group is destroyed); before, those a launcher gave (torchrun's RANK, WORLD_SIZE, LOCAL_RANK).
  Snapshots carry it in meta["distributed"], which Snapshot.merge keeps per rank.
- Collectives: while the SDK is on and the `collectives` option asks, the torch.distributed functions
  of snapshot.COLLECTIVES are replaced by ones that run torch's own inside a stage named
  `dist.<function>`: a child stage of the caller, timed on the host and, where the `gpu` integration is
  on, on the device with CUDA events (the stream waits for the collective: no synchronisation).
  A call with async_op=True is timed until it returns its Work (the launch).  Code that bound a
  function by name before instrument was imported, and code being traced by torch.compile, call
  torch's own.  Off (or `enabled` off), torch's functions are put back.
- gather(): every rank's snapshot sent to one rank over torch.distributed, on CPU tensors: the job's
  own group when its backend takes CPU tensors (gloo, mpi), else a gloo group made once for it.
"""
from __future__ import annotations

import functools
import json
import sys
import zlib
from typing import Any, Callable, Dict, List, Optional

from .. import config as _config
from ..snapshot import COLLECTIVE_PREFIX, COLLECTIVES, RANK_KEY, Snapshot, merge_all
from . import backend

_originals: Dict[str, Callable] = {}   # function name -> torch's own, while ours is in its place
_on = False                             # collectives timed now
_remembered: Optional[Dict[str, Any]] = None   # the rank last seen while the default group was up
_side: tuple = (None, None)            # (the default group, a gloo group over its ranks made for gather)


def _dist():
    d = sys.modules.get("torch.distributed")
    return d if d is not None and getattr(d, "is_available", lambda: False)() else None


def identity() -> Dict[str, Any]:
    """{"rank", "world_size", "local_rank", "backend", "source"} of this process (rank None when it is not one
    rank of a job; its host is meta["host"])."""
    global _remembered
    launcher = _config.launcher_rank() or {}
    d = _dist()
    try:
        if d is not None and d.is_initialized():
            _remembered = {"rank": d.get_rank(), "world_size": d.get_world_size(),
                           "local_rank": launcher.get("local_rank"), "backend": str(d.get_backend()),
                           "source": "torch.distributed"}
    except Exception:   # a group being torn down: what was seen last stands
        pass
    if _remembered is not None:
        return dict(_remembered)
    if launcher:
        return dict(launcher, backend=None, source="launcher environment")
    return {"rank": None, "world_size": None, "local_rank": None, "backend": None, "source": None}


name = RANK_KEY   # its key in Snapshot.meta (instrument.live.integrations)


def status(raw: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The rank, and whether collectives are timed; None (nothing in meta) when this process is no rank."""
    who = identity()
    return None if who["rank"] is None else dict(who, collectives="timed" if _on else "off")


# ---------------------------------------------------------------- collectives
def apply(cfg) -> None:
    """Collectives timed while `enabled` and `collectives` are on; torch's own functions back otherwise."""
    global _on
    d = _dist()
    if d is None:
        return
    if cfg.enabled and cfg.collectives:
        torch = sys.modules["torch"]
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
        for fn in COLLECTIVES:
            own = getattr(d, fn, None)
            if own is not None and fn not in _originals:
                _originals[fn] = own
                setattr(d, fn, _timed(fn, own, compiling))
        _on = True
    else:
        _on = False
        for fn, own in list(_originals.items()):
            if getattr(getattr(d, fn, None), "__wrapped__", None) is own:   # not replaced again by someone else
                setattr(d, fn, own)
            del _originals[fn]


def _timed(fn: str, own: Callable, compiling: Callable[[], bool]) -> Callable:
    stage_name = COLLECTIVE_PREFIX + fn

    @functools.wraps(own)
    def timed(*args, **kwargs):
        if not _on or compiling():
            return own(*args, **kwargs)
        if _remembered is None:
            identity()   # the group is up: remember the rank for snapshots taken after it is destroyed
        with backend.current.stage(stage_name):
            return own(*args, **kwargs)
    return timed


def _own(fn: str) -> Callable:
    """torch's own function, for the SDK's own traffic (not timed as the user's)."""
    return _originals.get(fn) or getattr(_dist(), fn)


# --------------------------------------------------------------------- gather
def gather(source: Callable[[], Snapshot], dst: int = 0, group: Any = None) -> Optional[Snapshot]:
    """Every rank's `source()` merged on rank `dst`, per rank (None on the other ranks).  A collective:
    every rank of the group calls it.  Memory: each rank's snapshot as compressed JSON, and on `dst`
    the group's size times the largest of them."""
    d = _dist()
    if d is None or not d.is_initialized():
        raise RuntimeError("instrument.distributed.gather: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first, then gather on every rank")
    if isinstance(dst, bool) or not isinstance(dst, int) or not 0 <= dst < d.get_world_size():
        raise ValueError(f"instrument.distributed.gather: dst must be a rank from 0 to {d.get_world_size() - 1}, "
                         f"got {dst!r}")
    torch = sys.modules["torch"]
    group = _cpu_group(d) if group is None else group
    world = d.get_world_size(group)
    data = zlib.compress(source().to_json(percentiles=False).encode("utf-8"), 1)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    _own("all_gather")(sizes, torch.tensor([len(data)], dtype=torch.int64), group=group)
    n = max(int(s) for s in sizes)
    mine = torch.zeros(n, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    here = d.get_rank() == dst
    parts: Optional[List[Any]] = [torch.empty(n, dtype=torch.uint8) for _ in range(world)] if here else None
    d.gather(mine, parts, dst=dst, group=group)
    if not here:
        return None
    return merge_all(Snapshot.from_dict(json.loads(zlib.decompress(p[:int(s)].numpy().tobytes())))
                           for p, s in zip(parts, sizes))


def _cpu_group(d) -> Any:
    """The group gather sends CPU tensors on: the default one if its backend takes them, else a gloo one."""
    global _side
    if any(b in str(d.get_backend()) for b in ("gloo", "mpi")):
        return None
    if _side[0] is not d.group.WORLD:
        _side = (d.group.WORLD, d.new_group(backend="gloo"))
    return _side[1]
