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

Capture windows are in ``instrument.live.capture``.
"""
from __future__ import annotations

import os
from typing import Dict

__all__ = ["color_for", "backend", "domain", "init", "push", "pop", "start", "end", "name_category", "category_id"]

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
        from .. import _native
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
