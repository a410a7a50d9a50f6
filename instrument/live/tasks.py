"""asyncio attribution: the CPU time and counters of a thread charged to the task
(the context) that runs on it, not to every stage open on the thread.

Mechanism, on every Python this package supports (3.9 to 3.13; the same code
runs on 3.14): every step of an asyncio task, and every other callback, runs in
`asyncio.events.Handle._run`, which enters the handle's context.  The backend's
`step_runner` stands in for that method: before the step it takes one reading
(the thread's counter group, or its CPU clock, and the time) and suspends the
task clock of the context that is left; after it, one reading resumes it and
suspends the handle's context.  `iteration_runner` stands in for
`BaseEventLoop._run_once` so that a reading is reused for the next step only
inside one loop iteration, never across its wait for events.  `ready_runner`
stands in for `BaseEventLoop._call_soon`, through which every task step is
scheduled: a suspended task whose step is scheduled was woken then (or at the
due time of the timer whose callback woke it), and from then until its step runs
it waits for the loop (loop-ready time), not for what it awaited.

uvloop runs task steps in its own C code, past `Handle._run`: every coroutine a
`uvloop.Loop` makes a task of is wrapped (`stepped`, at `uvloop.Loop.create_task`,
before any task factory) so that its own send/throw is the step, timed with the
same primitives; on asyncio's loops the wrapper finds its step timed already.
The stand-in is put on `uvloop.Loop` as uvloop defines the class (a passing
`AbstractEventLoop.__init_subclass__`), or at once where uvloop is imported.

Not covered, and marked rather than summed (`cpu_ns.overlapped_calls`): loops
that do neither (tasks made on uvloop before import, other loops), the first step
of eager tasks (3.12+ `eager_task_factory`), and contexts entered by hand with
`Context.run` while a stage of another context is open on the thread.  Python
3.14's context-switch watchers (`PyContext_AddWatcher`) would cover those too;
they are not used yet.

Installed when the `task_attribution` option is on (the default), at once if
asyncio is imported, else when `import asyncio` has run (importwatch).
"""
from __future__ import annotations

import platform
import sys
from typing import Any, Dict, Optional

from . import importwatch

MECHANISM = ("step hook: asyncio.events.Handle._run, BaseEventLoop._run_once and BaseEventLoop._call_soon "
             "stand-ins")
MECHANISM_UVLOOP = ("coroutine wrapper: each task's coroutine, wrapped at uvloop.Loop.create_task, times its own "
                    "steps (no loop-ready split)")
FALLBACK = ("calls that overlap other tasks on their thread where no hook sees the switch (tasks made on uvloop before "
            "instrument was imported, other loops, a context entered by hand) keep their wall time; their CPU time and "
            "counters are left out (cpu_ns.overlapped_calls)")

_backend = None          # the backend module whose runners are installed, or None
_wanted = None           # the backend to install once asyncio is imported
_reason: Optional[str] = "asyncio not imported yet"
_uvloop_reason: Optional[str] = None   # why uvloop.Loop is not hooked, where it is not


def _targets():
    ev, be = sys.modules.get("asyncio.events"), sys.modules.get("asyncio.base_events")
    if ev is None or be is None or not hasattr(ev, "Handle") or not hasattr(be, "BaseEventLoop"):
        return None
    return ev.Handle, be.BaseEventLoop


def _ours(m) -> bool:
    """A stand-in of ours: the C extension's _Runner."""
    t = type(m)
    return (t.__module__ == "instrument._native" and t.__name__ == "_Runner") or getattr(m, "_instrument_runner", False)


def _original(cls, name):
    """The method as asyncio defines it, under our stand-in if there is one."""
    m = cls.__dict__.get(name)
    while m is not None and _ours(m):
        m = m.__wrapped__
    return m


name = "tasks"   # the integration's key in Snapshot.meta


def configure(cfg) -> None:
    """Install the backend's runners (the task_attribution option) or remove them; at import and every configure()."""
    from . import backend
    apply(cfg.task_attribution, backend.current)


def apply(enabled: bool, backend) -> None:
    global _wanted, _reason
    if not enabled or not hasattr(backend, "step_runner"):
        _wanted = None
        importwatch.forget("asyncio")
        uninstall()
        _reason = ("the task_attribution option is off" if not enabled else
                   "the pure-Python fallback has no task clock; the C extension has one")
        return
    _wanted = backend
    if _targets() is None:
        _reason = "asyncio not imported yet"
        importwatch.when_imported("asyncio", _on_asyncio)
        return
    importwatch.forget("asyncio")
    _install(backend)
    _watch_loop_classes()
    _install_uvloop(backend, _uvloop_class())


def _on_asyncio() -> None:
    if _wanted is not None:
        _install(_wanted)
        _watch_loop_classes()


def _loop_class_made(cls, **kwargs):
    """asyncio.AbstractEventLoop.__init_subclass__ while attribution is on: uvloop's Loop, defined when uvloop is
    imported (which imports asyncio first), is hooked as it is made; no import watcher is left waiting for it."""
    if _wanted is not None and cls.__module__ == "uvloop" and cls.__name__ == "Loop":
        _install_uvloop(_wanted, cls)
    super(sys.modules["asyncio.events"].AbstractEventLoop, cls).__init_subclass__(**kwargs)


def _watch_loop_classes() -> None:
    base = sys.modules["asyncio.events"].AbstractEventLoop
    if "__init_subclass__" not in base.__dict__:
        base.__init_subclass__ = classmethod(_loop_class_made)


def _uvloop_class():
    m = sys.modules.get("uvloop")
    loop = getattr(m, "Loop", None) if m is not None else None
    return loop if isinstance(loop, type) else None


def _uvloop_hook(loop_cls):
    """Our create_task stand-in on uvloop.Loop, or None."""
    m = loop_cls.__dict__.get("create_task") if loop_cls is not None else None
    return m if getattr(m, "_instrument_create_task", False) else None


def _install_uvloop(backend, cls) -> None:
    """uvloop runs task steps in its own C code, past any Handle stand-in: every coroutine a uvloop.Loop makes a
    task of is wrapped so that its steps time themselves (a user's task factory gets the wrapped coroutine)."""
    global _uvloop_reason
    if cls is None or not hasattr(backend, "stepped"):
        return
    cur = cls.__dict__.get("create_task")
    if cur is not None and _uvloop_hook(cls) is None:
        _uvloop_reason = "uvloop.Loop.create_task was replaced by another library: left alone"
        return
    orig = cur.__wrapped__ if cur is not None else cls.create_task
    stepped = backend.stepped

    def create_task(self, coro, *args, **kwargs):
        return orig(self, stepped(coro), *args, **kwargs)

    create_task._instrument_create_task = True
    create_task.__wrapped__ = orig
    cls.create_task = create_task
    _uvloop_reason = None


def _install(backend) -> None:
    global _backend, _reason
    targets = _targets()
    if targets is None:
        return
    handle, loop = targets
    wanted = [(owner, name, _original(owner, name)) for owner, name, _ in _hooked(handle, loop)]
    if any(orig is None for _, _, orig in wanted):
        _reason = "this asyncio has no Handle._run / BaseEventLoop._run_once / BaseEventLoop._call_soon to hook"
        uninstall()
        return
    current = [owner.__dict__.get(name) for owner, name, _ in wanted]
    if any(cur is not orig and not _ours(cur) for cur, (_, _, orig) in zip(current, wanted)):
        _reason = "asyncio's Handle._run or BaseEventLoop._run_once or _call_soon was replaced by another library: left alone"
        return
    if _backend is backend and all(_ours(cur) for cur in current):
        return
    for (owner, name, orig), (_, _, make) in zip(wanted, _hooked(handle, loop)):
        r = getattr(backend, make)(orig)
        try:
            r._instrument_runner = True
        except AttributeError:
            pass   # the C runner is told by its type
        setattr(owner, name, r)
    _backend, _reason = backend, None


def _hooked(handle, loop):
    """(class, method, the backend's stand-in maker): every task step, every loop iteration, every task woken."""
    return ((handle, "_run", "step_runner"), (loop, "_run_once", "iteration_runner"), (loop, "_call_soon", "ready_runner"))


def uninstall() -> None:
    """Put asyncio's own methods back (only where ours are in place)."""
    global _backend
    cls = _uvloop_class()
    if _uvloop_hook(cls) is not None:
        del cls.create_task
    ev = sys.modules.get("asyncio.events")
    init = ev.AbstractEventLoop.__dict__.get("__init_subclass__") if ev is not None else None
    if getattr(init, "__func__", None) is _loop_class_made:
        del ev.AbstractEventLoop.__init_subclass__
    targets = _targets()
    if targets is not None:
        for owner, name, _ in _hooked(*targets):
            if _ours(owner.__dict__.get(name)):
                setattr(owner, name, _original(owner, name))
    _backend = None


def installed() -> bool:
    return _backend is not None


def _hooked_uvloop(loop) -> bool:
    """A uvloop.Loop (or a subclass) whose create_task is ours."""
    cls = _uvloop_class()
    return (cls is not None and isinstance(loop, cls)
            and getattr(getattr(type(loop), "create_task", None), "_instrument_create_task", False))


def _loop_in_use():
    """(the loop running on this thread, or None; the name of an event loop no hook sees the task switches of)."""
    aio = sys.modules.get("asyncio")
    if aio is None:
        return None, None
    running = aio.events._get_running_loop()
    be = sys.modules.get("asyncio.base_events")
    if running is not None:
        hooked = (be is not None and isinstance(running, be.BaseEventLoop)) or _hooked_uvloop(running)
        return running, None if hooked else f"{type(running).__module__}.{type(running).__name__}"
    try:
        policy = type(aio.get_event_loop_policy())
    except Exception:
        return None, None
    if "uvloop" in policy.__module__ and _uvloop_hook(_uvloop_class()) is None:
        return None, f"{policy.__module__}.{policy.__name__}"
    return None, None


def status(raw: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """What meta and doctor say: which attribution is in force, by what, and what it saw."""
    on = _backend is not None
    running, foreign = _loop_in_use() if on else (None, None)
    out: Dict[str, Any] = {
        "attribution": "overlapped calls marked" if not on or foreign else "per task",
        "mechanism": None if not on or foreign else MECHANISM_UVLOOP if _hooked_uvloop(running) else MECHANISM,
        "python": platform.python_version(),
        "installed": on,
        "reason": (f"the event loop in use ({foreign}) runs its callbacks outside asyncio.events.Handle and its "
                   "tasks are not made by a hooked create_task: no hook sees its task switches"
                   + (f" ({_uvloop_reason})" if _uvloop_reason else "")
                   + "; run it on a uvloop.Loop (uvloop.new_event_loop, uvloop.run) or on asyncio's own loop "
                   "(uvicorn --loop asyncio)" if foreign else None) if on else _reason,
        "fallback": FALLBACK,
    }
    tasks = (raw or {}).get("tasks")
    if tasks:
        out.update({k: tasks.get(k, 0) for k in ("steps", "switch_reads", "unhooked_changes", "overlapped_calls",
                                                 "abandoned_calls")})
    return out
