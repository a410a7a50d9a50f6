"""The one pair of stage hooks given to the backend, composed from the active integrations.

An integration's `enter(name)` returns a handle that its `exit(handle)` closes.
One integration active: its own functions are installed.  Several: a composed
pair.  None: `set_hooks(None, None)`, so the hot path makes no Python call.
A stage can exit under other hooks than it entered with (a profiler stopped
inside it); every exit hands a handle it does not know to `close()`, which finds
the right exit by the handle's type.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Tuple

from . import backend

_active: Dict[str, Tuple[Callable, Callable]] = {}   # name -> (enter, exit), in activation order
_closers: Dict[type, Callable] = {}                   # handle type -> the exit that closes it
_composed: Dict[tuple, tuple] = {}                    # kept alive: a hook may be running while it is replaced
_installed_on = None
_lock = threading.RLock()


def close(h) -> None:
    """Close a handle of any integration (composed handles are tuples, closed innermost first)."""
    if type(h) is tuple:
        for x in reversed(h):
            close(x)
    elif h is not None:
        f = _closers.get(type(h))
        if f is not None:
            f(h)


def activate(name: str, enter: Callable, exit: Callable, handle_type: type) -> None:
    with _lock:
        _closers[handle_type] = exit
        if _active.get(name) != (enter, exit):
            _active[name] = (enter, exit)
            _install()


def deactivate(name: str) -> None:
    with _lock:
        if _active.pop(name, None) is not None:
            _install()


def active() -> Tuple[str, ...]:
    return tuple(_active)


def reinstall() -> None:
    """Put the hooks on the backend in use now (it changes in tests and after configure)."""
    with _lock:
        _install()


def _compose(pairs) -> Tuple[Callable, Callable]:
    key = tuple(pairs)
    c = _composed.get(key)
    if c is None:
        enters = tuple(e for e, _ in pairs)

        def enter(name):
            return tuple([e(name) for e in enters])
        c = _composed[key] = (enter, close)
    return c


def _install() -> None:
    global _installed_on
    b = backend.current
    if _installed_on is not None and _installed_on is not b:
        _installed_on.set_hooks(None, None)
    pairs = list(_active.values())
    enter: Optional[Callable]
    enter, exit = (pairs[0] if len(pairs) == 1 else _compose(pairs)) if pairs else (None, None)
    b.set_hooks(enter, exit)
    _installed_on = b


backend.on_switch(lambda module: reinstall())
