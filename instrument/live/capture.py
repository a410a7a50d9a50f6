"""Capture windows: one NVTX start/end range opened after a warm-up, so that
``nsys profile -c nvtx -p NAME@instrument`` (``instrument nsys``) records only the
steady state.  Names and warm-ups default to the `capture` and `warmup` options.
"""
from __future__ import annotations

import atexit
import functools
import inspect
import sys
import threading
from typing import Callable, Dict, Optional

from . import callsite, collector, nvtx

__all__ = ["Capture", "capture", "capture_every", "close_all"]


def _check_args(name, warmup, iterations, profiler_api):
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1):
        raise ValueError(f"iterations must be None or an int >= 1, got {iterations!r}")
    if not isinstance(profiler_api, bool):
        raise TypeError(f"profiler_api must be a bool, got {profiler_api!r}")


class Capture:
    """One NVTX capture window, shared by every ``capture``/``capture_every`` of its name.

    Counting: an *iteration* is one ``with`` block, one call of a decorated function, or
    the span between two ``step()`` calls. Entries and exits are counted separately
    (``step()`` is an exit of the previous iteration, if any, then an entry).

    * The range opens when entry number ``warmup + 1`` begins, i.e. the first ``warmup``
      iterations are not captured.
    * It closes when exit number ``warmup + iterations`` completes; with
      ``iterations=None`` it closes at ``close()`` or at interpreter exit.
    * It opens at most once per process: later iterations are only counted.

    The range is a start/end range in the current domain (so it may end on another
    thread or task than it began), named ``name``: profile it with
    ``nsys profile -c nvtx -p NAME@DOMAIN`` (``instrument.nsys.build_command``).
    With ``profiler_api=True`` it also calls ``torch.cuda.profiler.start()/stop()``
    when torch is already imported and CUDA is initialised (torch is never imported here).

    Failures inside the window never reach the caller: the first one is reported as
    a ``RuntimeWarning``; a window whose range could not start stays closed.
    """

    def __init__(self, name: str, warmup: int = 0, iterations: Optional[int] = None, profiler_api: bool = False):
        _check_args(name, warmup, iterations, profiler_api)
        self.name, self.warmup, self.iterations, self.profiler_api = name, warmup, iterations, profiler_api
        self.entries = 0
        self.exits = 0
        self.range_id: Optional[int] = None
        self.state = "waiting"  # waiting -> open -> closed (or failed)
        self._profiler = None
        self._warned = False
        self._lock = threading.Lock()

    def _key(self):
        return (self.warmup, self.iterations, self.profiler_api)

    # -- counting ----------------------------------------------------------------------
    def _enter(self):
        with self._lock:
            self.entries += 1
            if self.state == "waiting" and self.entries == self.warmup + 1:
                self._open()

    def _exit(self):
        with self._lock:
            self.exits += 1
            if self.state == "open" and self.iterations is not None and self.exits >= self.warmup + self.iterations:
                self._close()

    def step(self) -> None:
        """Mark an iteration boundary: ends the previous iteration (if any), begins the next."""
        if self.entries > self.exits:
            self._exit()
        self._enter()

    def close(self) -> None:
        """Close the range now if it is open (idempotent)."""
        with self._lock:
            if self.state == "open":
                self._close()

    def __enter__(self):
        self._enter()
        return self

    def __exit__(self, *exc):
        self._exit()
        return False

    def __call__(self, fn: Callable) -> Callable:
        """Decorator: each call of ``fn`` is one iteration (coroutine functions too)."""
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args, **kwargs):
                self._enter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self._exit()
            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self._enter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._exit()
        return wrapper

    # -- emission (called with the lock held) --------------------------------------------
    def _open(self):
        self.state = "open"
        _register_atexit()
        if not self._guard(self._start_range):
            self.state = "failed"
        elif self.profiler_api:
            self._guard(self._start_profiler)

    def _start_range(self):
        nvtx.domain()  # make sure the domain exists before the range starts
        self.range_id = nvtx.start(self.name, nvtx.color_for(self.name))

    def _start_profiler(self):
        self._profiler = _cuda_profiler()
        if self._profiler is not None:
            self._profiler.start()

    def _close(self):
        self.state = "closed"
        prof, self._profiler = self._profiler, None
        self._guard(lambda: nvtx.end(self.range_id))
        if prof is not None:
            self._guard(prof.stop)

    def _guard(self, fn) -> bool:
        try:
            fn()
            return True
        except Exception as e:  # never raise into the serving loop; say it once
            if not self._warned:
                self._warned = True
                callsite.warn(f"instrument: NVTX capture {self.name!r}: {e!r}")
            return False

    def __repr__(self):
        return (f"Capture({self.name!r}, warmup={self.warmup}, iterations={self.iterations}, "
                f"state={self.state!r}, entries={self.entries})")


def _cuda_profiler():
    """torch.cuda.profiler when torch is already imported and CUDA is initialised, else None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    prof = getattr(cuda, "profiler", None)
    if prof is None:
        import importlib
        prof = importlib.import_module("torch.cuda.profiler")
    return prof


_captures: Dict[str, Capture] = {}
_registry_lock = threading.Lock()
_atexit_registered = False


def _register_atexit():
    global _atexit_registered
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(close_all)


def close_all() -> None:
    """Close every open capture range (runs at interpreter exit)."""
    for c in list(_captures.values()):
        c.close()


def _get(name, warmup, iterations, profiler_api, default_warmup) -> Capture:
    if name is None or warmup is None:   # the `capture` and `warmup` options in force
        cfg = collector.current_config()
        name = cfg.capture if name is None else name
        if warmup is None:
            warmup = default_warmup if cfg.warmup is None else cfg.warmup
    _check_args(name, warmup, iterations, profiler_api)
    c = _captures.get(name)
    if c is None:
        with _registry_lock:
            c = _captures.setdefault(name, Capture(name, warmup, iterations, profiler_api))
    if c._key() != (warmup, iterations, profiler_api):
        raise ValueError(
            f"capture {name!r} already exists with warmup={c.warmup}, iterations={c.iterations}, "
            f"profiler_api={c.profiler_api}; got warmup={warmup}, iterations={iterations}, "
            f"profiler_api={profiler_api} (one window per name)")
    return c


def capture(name: Optional[str] = None, warmup: Optional[int] = None, iterations: Optional[int] = None,
            profiler_api: bool = False) -> Capture:
    """The capture window called ``name`` (created on first use), for ``with`` blocks::

        for batch in loader:
            with instrument.capture("steady", warmup=20):
                serve(batch)

    makes exactly one range, from the start of the 21st block to interpreter exit (or
    ``close()``, or the end of block ``warmup + iterations``). Every call with the same
    name returns the same window, so counting spans calls; asking for a name again with
    different settings raises ``ValueError``. Defaults: the ``capture`` option (``"steady"``)
    and the ``warmup`` option, else 0 (``instrument.configure`` or the environment).
    See ``Capture`` for the exact counting rules.
    """
    return _get(name, warmup, iterations, profiler_api, 0)


def capture_every(name: Optional[str] = None, warmup: Optional[int] = None, iterations: Optional[int] = None,
                  profiler_api: bool = False) -> Capture:
    """Same window as ``capture`` but with ``warmup`` defaulting to 20; meant to be kept and
    used as a decorator on the per-request function, or driven with ``.step()``::

        @instrument.capture_every("steady", warmup=20, iterations=200)
        def handle(request): ...
    """
    return _get(name, warmup, iterations, profiler_api, 20)


def _reset_captures() -> None:
    """Tests only: close and forget every window."""
    close_all()
    _captures.clear()
