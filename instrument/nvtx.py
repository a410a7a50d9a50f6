"""NVTX emission and capture windows.

Emission goes through the C extension (``instrument._native``) when it was built with
the NVTX headers, else through the ``nvtx`` Python package, else nowhere. Every range
lives in one domain (``init(domain)``, default ``"instrument"``), uses a registered
string for its name, and gets ``color_for(name)`` unless a colour is given.

Module-level emitters (bound to the selected backend)::

    init(domain)                      create/select the domain
    push(name, color=None, category=0) / pop()          thread ranges
    start(name, color=None, category=0) -> id / end(id) process ranges (cross-thread)
    name_category(category, name)

Capture windows (``capture``/``capture_every``) open one start/end range after a warmup
so ``nsys profile -c nvtx -p NAME@instrument`` (see ``instrument.nsys``) records only
the steady state.
"""
from __future__ import annotations

import atexit
import functools
import inspect
import os
import sys
import threading
import warnings
from typing import Callable, Dict, NamedTuple, Optional

__all__ = [
    "color_for", "backend", "domain", "init", "push", "pop", "start", "end", "name_category",
    "Capture", "capture", "capture_every", "capture_defaults", "CaptureDefaults",
]

DEFAULT_DOMAIN = "instrument"

# Kelly's 22 colours of maximum contrast without white and black; identical to csrc/nvtx_emit.c.
_PALETTE = (
    0xFFF3C300, 0xFF875692, 0xFFF38400, 0xFFA1CAF1, 0xFFBE0032, 0xFFC2B280, 0xFF848482,
    0xFF008856, 0xFFE68FAC, 0xFF0067A5, 0xFFF99379, 0xFF604E97, 0xFFF6A600, 0xFFB3446C,
    0xFFDCD300, 0xFF882D17, 0xFF8DB600, 0xFF654522, 0xFFE25822, 0xFF2B3D26,
)


def color_for(name: str) -> int:
    """Stable ARGB colour for ``name``: FNV-1a 32 of its UTF-8 bytes into a fixed palette.

    Same name, same colour in every run and process; equal to ``_native.nvtx_color``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be str, not {type(name).__name__}")
    h = 2166136261
    for b in name.encode("utf-8"):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    h ^= h >> 16  # FNV-1a's low bits only see the bytes' low bits: fold before the modulo
    return _PALETTE[h % len(_PALETTE)]


# ---- backends ---------------------------------------------------------------------


_MISSING = object()


class _NvtxPackageEmitter:
    """Fallback through the ``nvtx`` package; its Domain is a no-op DummyDomain without a tool."""

    def __init__(self, nvtx_module):
        self._nvtx = nvtx_module
        self._domain_name = ""
        self._dom = None
        self._attrs: Dict[tuple, object] = {}  # (name, color, category) -> EventAttributes
        self._categories: Dict[int, int] = {}  # our category id -> the package's id

    def init(self, domain: str) -> None:
        if domain != self._domain_name or self._dom is None:
            self._domain_name = domain
            self._dom = self._nvtx.Domain(domain)
            self._attrs = {}
            self._categories = {}

    def _domain(self):
        if self._dom is None:
            self.init(DEFAULT_DOMAIN)
        return self._dom

    def _attributes(self, name, color, category):
        key = (name, color, category)
        a = self._attrs.get(key, _MISSING)
        if a is _MISSING:  # None is a valid cached value: the DummyDomain's attributes
            a = self._domain().get_event_attributes(
                message=name, color=color_for(name) if color is None else color,
                category=self._categories.get(category, category))
            self._attrs[key] = a
        return a

    def push(self, name, color=None, category=0):
        self._domain().push_range(self._attributes(name, color, category))

    def pop(self):
        self._domain().pop_range()

    def start(self, name, color=None, category=0):
        return self._domain().start_range(self._attributes(name, color, category)) or 0

    def end(self, range_id):
        self._domain().end_range(range_id)

    def name_category(self, category, name):
        # The package only names auto-numbered categories (Domain.get_category_id), so
        # our ids are mapped onto its ids: names and grouping match, the numbers may not.
        self._categories[category] = self._domain().get_category_id(name)
        self._attrs = {}

    def domain(self):
        return self._domain_name


class _NullEmitter:
    def __init__(self):
        self._domain_name = ""

    def init(self, domain):
        self._domain_name = domain

    def push(self, name, color=None, category=0):
        pass

    def pop(self):
        pass

    def start(self, name, color=None, category=0):
        return 0

    def end(self, range_id):
        pass

    def name_category(self, category, name):
        pass

    def domain(self):
        return self._domain_name


def _select_backend():
    try:
        from instrument import _native
        if hasattr(_native, "nvtx_push") and _native.nvtx_available():
            return "native", _native
    except ImportError:
        pass
    if not os.environ.get("NVTX_DISABLE"):
        try:
            import nvtx as nvtx_module
            return "nvtx", _NvtxPackageEmitter(nvtx_module)
        except Exception:  # an absent or broken optional dependency means no emission
            pass
    return "none", _NullEmitter()


_BACKEND, _impl = _select_backend()
if _BACKEND == "native":
    push = _impl.nvtx_push
    pop = _impl.nvtx_pop
    start = _impl.nvtx_range_start
    end = _impl.nvtx_range_end
    name_category = _impl.nvtx_name_category
    _init_impl = _impl.nvtx_init
    _domain_impl = _impl.nvtx_domain
else:
    push, pop, start, end = _impl.push, _impl.pop, _impl.start, _impl.end
    name_category = _impl.name_category
    _init_impl = _impl.init
    _domain_impl = _impl.domain


def backend() -> str:
    """``"native"`` (C extension), ``"nvtx"`` (the nvtx package) or ``"none"``."""
    return _BACKEND


def init(domain: str = DEFAULT_DOMAIN) -> None:
    """Create (once per name) and select the NVTX domain all ranges go to.

    Call before emitting: ranges open in the previous domain must be closed first."""
    if not isinstance(domain, str) or not domain:
        raise ValueError(f"domain must be a non-empty str, got {domain!r}")
    _init_impl(domain)


_categories: Dict[str, int] = {}


def category_id(name: str) -> int:
    """The NVTX category id for a category name: numbered from 1 in first-use
    order and named in the domain (nvtxDomainNameCategoryA) once."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"category must be a non-empty str, got {name!r}")
    cid = _categories.get(name)
    if cid is None:
        cid = _categories[name] = len(_categories) + 1
        name_category(cid, name)
    return cid


def domain() -> str:
    """Name of the current domain (initialising the default one if none was chosen)."""
    if not _domain_impl():
        init(DEFAULT_DOMAIN)
    return _domain_impl()


# ---- capture windows ----------------------------------------------------------------


class CaptureDefaults(NamedTuple):
    name: str
    warmup: Optional[int]  # None when INSTRUMENT_WARMUP is unset


def capture_defaults() -> CaptureDefaults:
    """Defaults from the environment: ``INSTRUMENT_CAPTURE`` (range name, default
    ``"steady"``) and ``INSTRUMENT_WARMUP`` (int >= 0, default unset). Bad values warn
    and fall back to the defaults."""
    name = os.environ.get("INSTRUMENT_CAPTURE", "").strip() or "steady"
    raw = os.environ.get("INSTRUMENT_WARMUP", "").strip()
    warmup = None
    if raw:
        try:
            warmup = int(raw)
            if warmup < 0:
                raise ValueError
        except ValueError:
            warnings.warn(f"INSTRUMENT_WARMUP={raw!r} is not an int >= 0; ignoring it", RuntimeWarning, stacklevel=2)
            warmup = None
    return CaptureDefaults(name, warmup)


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
        domain()  # make sure the domain exists before the range starts
        self.range_id = start(self.name, color_for(self.name))

    def _start_profiler(self):
        self._profiler = _cuda_profiler()
        if self._profiler is not None:
            self._profiler.start()

    def _close(self):
        self.state = "closed"
        prof, self._profiler = self._profiler, None
        self._guard(lambda: end(self.range_id))
        if prof is not None:
            self._guard(prof.stop)

    def _guard(self, fn) -> bool:
        try:
            fn()
            return True
        except Exception as e:  # never raise into the serving loop; say it once
            if not self._warned:
                self._warned = True
                warnings.warn(f"instrument: NVTX capture {self.name!r}: {e!r}", RuntimeWarning, stacklevel=5)
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
    if name is None or warmup is None:  # the environment is read only when it matters
        defaults = capture_defaults()
        name = defaults.name if name is None else name
        if warmup is None:
            warmup = default_warmup if defaults.warmup is None else defaults.warmup
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
    different settings raises ``ValueError``. Defaults: ``name`` from
    ``INSTRUMENT_CAPTURE`` else ``"steady"``, ``warmup`` from ``INSTRUMENT_WARMUP`` else 0.
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
