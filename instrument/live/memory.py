"""Memory per stage: the sources the `memory` option names, handed to the C core as gauges it reads and resets
(csrc/memory.h keeps every open call's own peak through the resets, nested or on other threads).

- host: the resident set, read by the C core itself (getrusage's high-water mark, reset through
  /proc/self/clear_refs).
- python: the traced Python heap (tracemalloc, started here if it is not tracing).
- cuda: each device's allocated bytes (`cuda:N`) and reserved bytes (`cuda:N:reserved`), from one read of torch's
  allocator statistics per device, once torch has initialised CUDA; reset with reset_peak_memory_stats.

The pure-Python fallback reads no memory (its MISSING says so).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import backend as _backend

name = "memory"   # its key in Snapshot.meta

CUDA_DEVICES_MAX = 3   # with host and python, 8 sources: the C core's MEM_SOURCES
_cfg = None
_tracing_started = False   # tracemalloc was started here (and is stopped when python is turned off)
_lazy_registered = False
_cuda_in_use: Tuple[int, ...] = ()
_forked = False   # a child forked after CUDA was in use: CUDA cannot be read here
_cuda_error: Optional[str] = None   # why torch's allocator statistics could not be read


def _reset_seen(names: Callable[..., List[str]], *args: Any, **kwargs: Any) -> None:
    """Another party resets the peaks of the sources names(*args, **kwargs) gives: the open calls keep theirs through
    it, and are marked.  Never raises into the caller's reset."""
    try:
        f = getattr(_backend.current, "memory_reset_seen", None)
        if f is not None:
            f(names(*args, **kwargs))
    except Exception:
        pass


def _wrap(owner: Any, attr: str, names: Callable[..., List[str]]) -> None:
    """owner.attr (a user-visible reset of a peak) tells the C core first; once, and undone by nothing (a wrapper
    whose source is off does no more than the call itself)."""
    orig = getattr(owner, attr, None)
    if orig is None or getattr(orig, "__instrument_wrapped__", False):
        return

    def reset(*args: Any, **kwargs: Any) -> Any:
        _reset_seen(names, *args, **kwargs)
        return orig(*args, **kwargs)
    reset.__instrument_wrapped__ = True   # type: ignore[attr-defined]
    reset.__wrapped__ = orig              # type: ignore[attr-defined]
    reset.__doc__, reset.__name__ = orig.__doc__, getattr(orig, "__name__", attr)
    setattr(owner, attr, reset)


def _python_source() -> Tuple[str, Callable[[], Tuple[int, int]], Callable[[], None]]:
    global _tracing_started
    import _tracemalloc
    import tracemalloc
    if not tracemalloc.is_tracing():
        tracemalloc.start()
        _tracing_started = True
    _wrap(tracemalloc, "reset_peak", lambda: ["python"])
    return ("python", _tracemalloc.get_traced_memory, _tracemalloc.reset_peak)


def _cuda_device_names(device: Any = None) -> List[str]:
    torch = sys.modules["torch"]
    try:
        d = torch.cuda.current_device() if device is None else torch.device(device).index
        d = torch.cuda.current_device() if d is None else d
    except Exception:
        d = 0
    return [f"cuda:{d}", f"cuda:{d}:reserved"]


def _cuda_ready() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def _cuda_sources() -> List[Tuple[str, Callable[[], Tuple[int, int]], Optional[Callable[[], None]]]]:
    """Per device, allocated then reserved bytes: the first reads torch's statistics (one call, both figures), the
    second the same read, and its reset is the first's (one reset_peak_memory_stats resets both peaks)."""
    global _cuda_in_use
    torch = sys.modules["torch"]
    stats_of = torch._C._cuda_memoryStats   # the allocator's nested dict: a flat memory_stats() costs 10x more
    reset_of = torch._C._cuda_resetPeakMemoryStats   # the SDK's own reset: not the wrapped one below
    _wrap(torch.cuda.memory, "reset_peak_memory_stats", _cuda_device_names)   # also reset_max_memory_allocated's
    torch.cuda.reset_peak_memory_stats = torch.cuda.memory.reset_peak_memory_stats
    out: List[Tuple[str, Any, Any]] = []
    devices = tuple(range(min(torch.cuda.device_count(), CUDA_DEVICES_MAX)))
    for d in devices:
        last: Dict[str, Any] = {}

        def allocated(d: int = d, last: Dict[str, Any] = last) -> Tuple[int, int]:
            s = last["s"] = stats_of(d)
            a = s["allocated_bytes"]["all"]
            return a["current"], a["peak"]

        def reserved(last: Dict[str, Any] = last) -> Tuple[int, int]:
            r = last.pop("s")["reserved_bytes"]["all"]   # this sample's read (a stopped cuda:N leaves none: stops too)
            return r["current"], r["peak"]

        out.append((f"cuda:{d}", allocated, lambda d=d: reset_of(d)))
        out.append((f"cuda:{d}:reserved", reserved, None))
    _cuda_in_use = devices
    return out


def _on_cuda_init() -> None:
    try:   # runs inside torch.cuda._lazy_init: must never raise
        if _cfg is not None:
            apply(_cfg)
    except Exception:
        pass


def apply(cfg) -> None:
    """Hand the sources the configuration names to the hot path (the C core; the fallback has no `memory`)."""
    global _cfg, _lazy_registered, _tracing_started, _cuda_error, _cuda_in_use
    _cfg = cfg
    if "cuda" not in cfg.memory:
        _cuda_in_use = ()
    be = _backend.current
    if not hasattr(be, "memory_status"):   # the fallback: no `memory` option (MISSING)
        return
    sources: List[Any] = []
    if "host" in cfg.memory:
        sources.append("host")
    if "python" in cfg.memory:
        sources.append(_python_source())
    elif _tracing_started:
        import tracemalloc
        tracemalloc.stop()
        _tracing_started = False
    if "cuda" in cfg.memory:
        torch = sys.modules.get("torch")
        if _forked:
            pass
        elif _cuda_ready():
            try:
                sources.extend(_cuda_sources())
                _cuda_error = None
            except Exception as e:   # a torch without the allocator's statistics: CUDA is not read, and status says so
                _cuda_error = f"{type(e).__name__}: {e}"
        elif torch is not None and not _lazy_registered:
            try:   # CUDA's sources start when torch initialises it, whenever that is
                torch.cuda._lazy_call(_on_cuda_init)
                _lazy_registered = True
            except Exception:
                pass
    be.configure(memory=sources)


# ------------------------------------------------------- integration protocol (apply: the collector, before it
# calibrates the reads' cost, which then holds the memory reads)
def before_snapshot() -> None:
    if _cfg is not None and "cuda" in _cfg.memory and not _cuda_in_use and not _cuda_error and _cuda_ready():
        apply(_cfg)


def after_fork_child() -> None:
    global _cuda_in_use, _forked
    if _cuda_in_use and _cfg is not None:   # the parent's CUDA context is not usable here
        _cuda_in_use, _forked = (), True
        apply(_cfg)


def status(raw: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    be = _backend.current
    if not hasattr(be, "memory_status"):
        return {"sources": [], "reason": "not measured by the pure-Python fallback"}
    out: Dict[str, Any] = {"sources": be.memory_status()}
    if _cfg is not None and "cuda" in _cfg.memory and not _cuda_in_use:
        out["cuda"] = ("forked child: CUDA cannot be used in a process forked after it was initialised" if _forked
                       else f"not read: {_cuda_error}" if _cuda_error else "waiting for torch to initialise CUDA")
    return out
