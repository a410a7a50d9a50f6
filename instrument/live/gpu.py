"""GPU time per stage from CUDA events, without stalling the host.

With `configure(gpu=True)` or the variable of the `gpu` option (or `auto`, the default, once
torch has initialised CUDA) a stage records a timing event on the current CUDA
stream at enter and at exit.  The pair waits in a bounded pool (`gpu_events`)
and is resolved with `event.query()` at later stage exits (every 16th, oldest
first) and at `snapshot()`, which waits once for the newest pending event.
Nothing on the hot path synchronises.  A stage entered while the pool is full
records no events and counts as `dropped`.

Per stage, `snapshot()[path].gpu` = {total_ns, samples, mean_ns, min_ns,
max_ns, p50_ns, p99_ns, dropped, errors, hist}: the stream time between the
stage's two events (the work it queued, plus any gaps the host left), with
percentiles from the same `log2-64` histogram as wall times.  Events are made
on the device current when first needed; a stage that records on another
device counts in `errors`.
"""
from __future__ import annotations

import collections
import sys
import threading
from typing import Any, Dict, Optional, Tuple

from .. import histogram as _hist
from ..snapshot import gpu_fields
from . import backend, hooks

RESOLVE_EVERY = 16

_lock = threading.Lock()
_want = False            # the option asks for GPU timing now
_on = False              # hooks installed
_reason: Optional[str] = "torch is not imported"
_bound = 4096
_option = "auto"         # the `gpu` option in force
_cfg: Any = None         # the configuration in force, for CUDA initialising later
_cuda_ready = False      # CUDA initialised (seen by the torch.cuda._lazy_call callback)
_lazy_registered = False
_forked = False
_epoch = 0
_countdown = RESOLVE_EVERY
_new_event: Any = None
_pending: "collections.deque[_Pending]" = collections.deque()
_free: list = []
_stats: Dict[Tuple[str, ...], list] = {}   # path -> [total, samples, dropped, errors, min, max, hist]


class _Pending:
    __slots__ = ("path", "start", "end", "epoch")


def _stat(path) -> list:
    s = _stats.get(path)
    if s is None:
        s = _stats[path] = [0, 0, 0, 0, None, None, {}]
    return s


def _enter(name):
    path = backend.current.current_path()
    if len(_pending) >= _bound:
        _resolve()
        if len(_pending) >= _bound:
            with _lock:
                _stat(path)[2] += 1
            return None
    try:
        r = _free.pop()
    except IndexError:
        r = _Pending()
        r.start, r.end = _new_event(), _new_event()
    r.path, r.epoch = path, _epoch
    try:
        r.start.record()
    except Exception:
        with _lock:
            _stat(path)[3] += 1
        return None
    return r


def _exit(r) -> None:
    global _countdown
    if r.__class__ is not _Pending:
        if r is not None:
            hooks.close(r)
        return
    try:
        r.end.record()
    except Exception:
        with _lock:
            _stat(r.path)[3] += 1
        return
    _pending.append(r)
    _countdown -= 1
    if _countdown <= 0:
        _countdown = RESOLVE_EVERY
        _resolve()


def _record(r, ns: Optional[int]) -> None:
    if r.epoch != _epoch:
        return
    s = _stat(r.path)
    if ns is None:
        s[3] += 1
        return
    s[0] += ns
    s[1] += 1
    s[4] = ns if s[4] is None else min(s[4], ns)
    s[5] = ns if s[5] is None else max(s[5], ns)
    i = _hist.index(ns)
    s[6][i] = s[6].get(i, 0) + 1


def _elapsed(r) -> Optional[int]:
    try:
        return max(int(round(r.start.elapsed_time(r.end) * 1e6)), 0)
    except Exception:
        return None


def _resolve(scan: bool = False) -> None:
    """Oldest first, stopping at the first event not yet reached (scan=True: look at all)."""
    if not _lock.acquire(blocking=False):
        return   # another thread is resolving
    try:
        keep = []
        while _pending:
            r = _pending[0]
            try:
                done = r.end.query()
            except Exception:
                done = True
            if not done:
                if not scan:
                    break
                keep.append(_pending.popleft())
                continue
            _pending.popleft()
            _record(r, _elapsed(r))
            if len(_free) < _bound:
                _free.append(r)
        _pending.extendleft(reversed(keep))
    finally:
        _lock.release()


def _available() -> Optional[str]:
    """None when CUDA can be used, else why not."""
    if _forked:
        return "forked child: CUDA cannot be used in a process forked after it was initialised"
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "cuda"):
        return "torch is not imported"
    if getattr(torch.version, "cuda", None) is None and getattr(torch.version, "hip", None) is None:
        return f"torch {torch.__version__} is built without CUDA"
    try:
        if not torch.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
    except Exception as e:
        return f"torch.cuda.is_available() failed: {e}"
    return None


def _on_cuda_init() -> None:
    global _cuda_ready
    try:   # runs inside torch.cuda._lazy_init: must never raise
        _cuda_ready = True
        if _cfg is not None:
            apply(_cfg)
    except Exception:
        pass


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return _cuda_ready or bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def apply(cfg) -> None:
    """Turn GPU timing on or off as the configuration asks and CUDA allows."""
    global _want, _on, _reason, _bound, _new_event, _lazy_registered, _option, _cfg
    _cfg, _option, _bound = cfg, cfg.gpu, cfg.gpu_events
    torch = sys.modules.get("torch")
    if cfg.gpu == "auto" and torch is not None and not _lazy_registered and not _cuda_initialised():
        try:   # auto turns on when CUDA initialises, whenever that is
            torch.cuda._lazy_call(_on_cuda_init)
            _lazy_registered = True
        except Exception:
            pass
    _want = cfg.gpu == "on" or (cfg.gpu == "auto" and _cuda_initialised())
    why = _available() if _want else ("off (configure(gpu='off'))" if cfg.gpu == "off"
                                      else "auto: waiting for torch to initialise CUDA")
    if _want and why is None:
        if _new_event is None:
            ev = getattr(torch, "Event", None)   # torch.Event records on the current stream without Python work
            _new_event = ((lambda: ev(device="cuda", enable_timing=True)) if ev is not None
                          else (lambda: torch.cuda.Event(enable_timing=True)))
        hooks.activate("gpu", _enter, _exit, _Pending)
        _on, _reason = True, None
    else:
        hooks.deactivate("gpu")
        _on, _reason = False, why


# ------------------------------------------------------- integration protocol
name = "gpu"   # its key in Snapshot.meta (instrument.live.integrations)


def before_snapshot() -> None:
    if not _on and _option == "auto" and _cfg is not None and _cuda_initialised():
        apply(_cfg)
    if _pending:
        try:
            _pending[-1].end.synchronize()   # the one wait: for the newest pending event
        except Exception:
            pass
        _resolve(scan=True)


def stage_fields() -> Dict[Tuple[str, ...], Dict[str, Any]]:
    with _lock:
        return {path: {"gpu": gpu_fields(*s)} for path, s in _stats.items()}


def reset() -> None:
    global _epoch
    with _lock:
        _stats.clear()
        _epoch += 1   # pairs still pending belong to before the reset


def after_fork_child() -> None:
    global _forked, _on, _reason, _lock
    _lock = threading.Lock()
    torch = sys.modules.get("torch")
    if _on or _cuda_initialised() or (torch is not None and getattr(torch.cuda, "_is_in_bad_fork", lambda: False)()):
        _forked = True   # the parent's events and CUDA context are not usable here
    _pending.clear()
    _free.clear()
    _stats.clear()
    if _forked:
        hooks.deactivate("gpu")
        _on, _reason = False, _available()


def status(raw: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    torch = sys.modules.get("torch")
    cuda: Dict[str, Any] = {"built": None, "initialized": None, "available": None}
    if torch is not None and hasattr(torch, "cuda"):
        cuda["built"] = getattr(torch.version, "cuda", None)
        cuda["initialized"] = _cuda_initialised()
        if cuda["initialized"] or _option == "on":   # is_available() would initialise the driver otherwise
            try:
                cuda["available"] = bool(torch.cuda.is_available())
            except Exception:
                cuda["available"] = False
    with _lock:
        dropped = sum(s[2] for s in _stats.values())
        errors = sum(s[3] for s in _stats.values())
    return {"option": _option, "timing": _on, "reason": _reason, "pool": _bound, "pending": len(_pending),
            "dropped": dropped, "errors": errors, "cuda": cuda}

