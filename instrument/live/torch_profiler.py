"""Stages as torch.profiler ranges, and profiler events attributed to stages.

Ranges.  While a torch profiler session records, every stage entered also
opens a profiler range named after the stage, so stages show in
`prof.key_averages()`, `export_chrome_trace()` and TensorBoard.  The range is
a `torch._C._profiler._RecordFunctionFast` (one at::RecordFunction, entered and
exited from C: a stage under a profiler costs ~0.15x a `record_function`
block), recorded as a `cpu_op` event (as torch.compile's ranges are), not a
`user_annotation`; on a torch without it, the ops `record_function` uses
(`profiler::_record_function_enter_new` / `_record_function_exit`).
`status()["range"]` names the one in force.  Sessions are those of
`torch.profiler.profile` (context manager or start/stop; with a schedule, from
the step recording starts to the step it stops) and of
`torch.autograd.profiler.profile`; both pass through
`torch.autograd.profiler.profile._start_trace` and `__exit__`, which are
wrapped to flip a flag.  The rule: stages entered while a session records that
started once both torch and instrument were imported (in either order, see
instrument.live.torchwatch), or that was already recording when instrument first
saw torch; `instrument.profile()` always.  With no session recording no torch
call is made on the hot path (the backend has no hooks at all).

Attribution.  `instrument.profile(...)` is `torch.profiler.profile(...)` whose
trace, at the end of every recording cycle, is folded into the snapshot: each
CPU op goes to the innermost stage range enclosing it (its `cpu_parent` chain),
device kernels go with the op that launched them (torch's correlation ids), and
`snapshot()[path].ops` holds the top operators of that stage (docs/torch.md).

Limits: stages of asyncio tasks interleaving on one thread do not nest as
ranges; a user `record_function` (or an operator) with a stage's name counts as
that stage;
`emit_nvtx`/`emit_itt` sessions do not open stage ranges.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Dict, Iterable, Optional, Tuple

from ..snapshot import OP_FIELDS, ranked_ops
from . import backend, callsite, hooks

_lock = threading.RLock()
_patched = False
_error: Optional[str] = None
_enabled = True          # the `torch` option is not off
_option = "auto"         # the `torch` option in force
_sessions = 0            # sessions recording now
_foreign = False         # a session was already recording when the wrappers went in
_range: Optional[str] = None   # the range mechanism in force (FAST or OPS), once torch is seen
_exit_op: Any = None
_Handle: Any = None            # the class of an OPS range handle (torch.ScriptObject)
_Fast: Any = None              # the class of a FAST range handle (torch._C._profiler._RecordFunctionFast)
_no_torch_function: Any = None
FAST = "RecordFunctionFast"    # torch._C._profiler._RecordFunctionFast
OPS = "record_function ops"    # torch.ops.profiler._record_function_enter_new / _record_function_exit
_ops: Dict[Tuple[str, ...], Dict[str, list]] = {}    # path -> op name -> [calls, self_cpu, cpu_total, device] ns
_profiled: Dict[Tuple[str, ...], int] = {}           # path -> stage ranges seen in profiles
_counts = {"profiles": 0, "events": 0, "unattributed_ranges": 0}
_warned = set()


def _current_path() -> Tuple[str, ...]:
    return backend.current.current_path()


def install() -> None:
    """Wrap the start and the end of every torch profiler session (once torch is imported)."""
    global _patched, _error, _foreign
    with _lock:
        if _patched:
            return
        try:
            import torch.autograd.profiler as ap
            P = ap.profile
            start, stop = P._start_trace, P.__exit__
        except Exception as e:
            _error = f"torch.autograd.profiler.profile has no _start_trace/__exit__ to wrap: {e}"
            return
        if not getattr(start, "_instrument", False):
            def _start_trace(self, *args, **kwargs):
                r = start(self, *args, **kwargs)
                if not getattr(self, "_instrument_on", False):
                    self._instrument_on = True
                    self._instrument_prefix = _current_path()   # stages open on this thread when recording began
                    _session(1)
                return r

            def __exit__(self, *args, **kwargs):
                try:
                    return stop(self, *args, **kwargs)
                finally:
                    if getattr(self, "_instrument_on", False):
                        self._instrument_on = False
                        _session(-1)
                    elif _foreign and not getattr(ap, "_is_profiler_enabled", False):
                        _end_foreign()
            _start_trace._instrument = __exit__._instrument = True   # type: ignore[attr-defined]
            _start_trace.__wrapped__, __exit__.__wrapped__ = start, stop   # type: ignore[attr-defined]
            P._start_trace, P.__exit__ = _start_trace, __exit__
        _patched = True
        if getattr(ap, "_is_profiler_enabled", False) and not _foreign:
            _foreign = True
            _session(1)


def _end_foreign() -> None:
    global _foreign
    with _lock:
        if _foreign:
            _foreign = False
            _session(-1)


def _session(delta: int) -> None:
    global _sessions
    with _lock:
        _sessions = max(0, _sessions + delta)
        _update()


def _enter_fast(name):
    r = _Fast(name)
    r.__enter__()
    return r


def _exit_fast(h) -> None:
    if h.__class__ is _Fast:
        try:
            h.__exit__()
        except RuntimeError:
            pass   # entered where torch had no profiler state (nothing opened), exited where it has one
    elif h is not None:
        hooks.close(h)


def _exit(h) -> None:
    if h.__class__ is _Handle:
        with _no_torch_function():   # as record_function does: probing a ScriptObject for __torch_function__ is slow
            _exit_op(h)
    elif h is not None:
        hooks.close(h)


def _mechanism(torch) -> Tuple[str, Any]:
    fast = getattr(getattr(getattr(torch, "_C", None), "_profiler", None), "_RecordFunctionFast", None)
    if fast is not None and hasattr(fast, "__enter__") and hasattr(fast, "__exit__"):
        return FAST, fast
    return OPS, None


def _update() -> None:
    global _exit_op, _Handle, _Fast, _no_torch_function, _range
    if not (_enabled and _patched and _sessions > 0):
        hooks.deactivate("torch")
        return
    import torch
    _range, fast = _mechanism(torch)
    if fast is not None:
        _Fast = fast
        hooks.activate("torch", _enter_fast, _exit_fast, fast)
        return
    ops = torch.ops.profiler
    enter, exit_ = ops._record_function_enter_new, ops._record_function_exit
    if isinstance(enter, torch._ops.OpOverloadPacket):   # the C function itself: no Python frame per stage
        enter = getattr(enter.default, "_op", enter.default)
    if isinstance(exit_, torch._ops.OpOverloadPacket):
        exit_ = getattr(exit_._RecordFunction, "_op", exit_._RecordFunction)
    _exit_op, _Handle, _no_torch_function = exit_, torch.ScriptObject, torch._C.DisableTorchFunctionSubclass
    hooks.activate("torch", enter, _exit, torch.ScriptObject)


def apply(cfg) -> None:
    global _enabled, _option
    with _lock:
        _option = cfg.torch
        _enabled = cfg.torch != "off"
        _update()


# ------------------------------------------------------------------ profile
def profile(schedule=None, record_shapes: bool = False, activities=None, **kwargs):
    """`torch.profiler.profile` with the same arguments and the same object back
    (`with instrument.profile() as prof:`; `prof.step()`, `prof.key_averages()`,
    `prof.export_chrome_trace()`); at the end of every recording cycle its events
    are attributed to stages and appear as `ops` in the snapshot."""
    import torch.profiler
    if _option == "off":
        _warn_once("off", "instrument.profile: configure(torch='off') is in force: stages open no profiler ranges "
                   "and no operator is attributed to them")
    user_ready = kwargs.pop("on_trace_ready", None)
    seen: Optional[set] = set() if kwargs.get("acc_events") else None   # accumulated cycles: fold new events only

    def on_trace_ready(prof):
        try:
            fold(prof, seen)
        except Exception as e:   # attribution must never break the user's profiling
            callsite.warn(f"instrument: could not attribute profiler events to stages: {e}")
        if user_ready is not None:
            user_ready(prof)
    return torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=record_shapes,
                                  on_trace_ready=on_trace_ready, **kwargs)


def fold(prof, seen: Optional[set] = None) -> None:
    """Attribute the events of a finished cycle of `prof` (a torch.profiler.profile) to stages."""
    events = prof.events()
    if events is None:
        return
    if seen is not None:
        events = [e for e in events if id(e) not in seen]
        seen.update(id(e) for e in events)
    inner = getattr(prof, "profiler", prof)
    attribute(events, tuple(getattr(inner, "_instrument_prefix", ()) or ()))


def attribute(events: Iterable[Any], prefix: Tuple[str, ...] = ()) -> None:
    """Fold FunctionEvents into the per-stage operator tables.  A stage range's
    path is the chain of stage ranges above it; when that chain is not a known
    stage path (stages already open when recording began) it is tried under
    `prefix`, then as the tail of a known path (the one with most calls)."""
    from torch.autograd import DeviceType
    raw = backend.current.collect()
    paths: Dict[int, tuple] = {}
    for nid, parent, name, _other in raw["nodes"]:
        paths[nid] = (paths[parent] if parent > 0 else ()) + (name,)
    calls = {paths[s["node"]]: s["calls"] for s in raw["stats"]}
    known = set(paths.values())
    names = {p[-1] for p in known}
    by_chain: Dict[tuple, Optional[tuple]] = {}
    by_range: Dict[int, Optional[tuple]] = {}

    def is_stage(e) -> bool:   # fast ranges are cpu_op events, the ops' ones user annotations
        return e.name in names

    def resolve(chain: tuple) -> Optional[tuple]:
        if chain not in by_chain:
            cands = [c for c in (prefix + chain, chain) if c in known]
            if not cands:
                cands = sorted((p for p in known if p[-len(chain):] == chain), key=lambda p: -calls.get(p, 0))
            by_chain[chain] = cands[0] if cands else None
        return by_chain[chain]

    def range_path(r) -> Optional[tuple]:
        k = id(r)
        if k not in by_range:
            chain, p = [], r
            while p is not None:
                if is_stage(p):
                    chain.append(p.name)
                p = p.cpu_parent
            by_range[k] = resolve(tuple(reversed(chain)))
        return by_range[k]

    n = unattributed = 0
    with _lock:
        for e in events:
            if e.device_type != DeviceType.CPU or e.is_async:
                continue   # device events count through the op that launched them (e.kernels)
            if is_stage(e):
                path = range_path(e)
                if path is None:
                    unattributed += 1
                else:
                    _profiled[path] = _profiled.get(path, 0) + 1
                continue
            if e.name.startswith("ProfilerStep#"):
                continue
            r = e.cpu_parent
            while r is not None and not is_stage(r):
                r = r.cpu_parent
            path = range_path(r) if r is not None else None
            if path is None:
                continue
            acc = _ops.setdefault(path, {}).setdefault(e.name, [0, 0, 0, 0])
            acc[0] += 1
            acc[1] += _ns(e.self_cpu_time_total)
            acc[2] += _ns(e.cpu_time_total)
            acc[3] += _ns(sum(k.duration for k in e.kernels))
            n += 1
        _counts["profiles"] += 1
        _counts["events"] += n
        _counts["unattributed_ranges"] += unattributed


def _ns(us: float) -> int:
    return int(round(us * 1000))


# ------------------------------------------------------- integration protocol
name = "torch_profiler"   # its key in Snapshot.meta (instrument.live.integrations)


def stage_fields() -> Dict[Tuple[str, ...], Dict[str, Any]]:
    with _lock:
        out = {}
        for path in set(_ops) | set(_profiled):
            table = _ops.get(path, {})
            entries = {name: {"name": name, **dict(zip(OP_FIELDS, v))} for name, v in table.items()}
            out[path] = {"ops": ranked_ops(entries, sum(v[3] for v in table.values()), _profiled.get(path, 0))}
        return out


def reset() -> None:
    with _lock:
        _ops.clear()
        _profiled.clear()
        for k in _counts:
            _counts[k] = 0


def after_fork_child() -> None:
    global _sessions, _foreign
    with _lock:
        _sessions, _foreign = 0, False   # a profiler session does not follow into a child
        _update()
        reset()


def status(raw: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", None) if torch else None
    if _option == "off":
        state = "off (the torch option: configure(torch='off') or its variable)"
    elif _error:
        state = "error"
    elif version is None:
        import importlib.util
        try:
            installed = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):
            installed = False
        state = "waiting for `import torch`" if installed else "torch is not installed"
    elif not _patched:
        state = "torch imported; not yet seen (next configure/snapshot/instrument.profile)"
    else:
        state = "recording: stages open profiler ranges" if _sessions else "ready: no profiler session recording"
    return {"option": _option, "torch": str(version) if version else None, "state": state, "error": _error,
            "patched": _patched, "recording_sessions": _sessions, "ranges": "torch" in hooks.active(),
            "range": (_range if "torch" in hooks.active() else _mechanism(torch)[0]) if version else None,
            **{k: v for k, v in _counts.items()}}


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        callsite.warn(msg)

