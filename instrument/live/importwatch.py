"""Runs a callback the moment a module is imported, without importing it.

A finder at the front of sys.meta_path finds nothing itself: when a watched name
is imported it wraps that module's loader, so the callback runs right after the
module's own code, and the module keeps its real loader.  The finder removes
itself once no name is watched, so imports cost nothing afterwards.
`importlib.util.find_spec(name)` alone (an availability check) does not fire it.
asyncio attribution (tasks.py) and the torch integrations (torchwatch.py) use it.
"""
from __future__ import annotations

import sys
from typing import Callable, Dict

from . import callsite

_waiting: Dict[str, Callable[[], None]] = {}   # module name -> what runs once it is imported


def when_imported(name: str, callback: Callable[[], None]) -> None:
    """`callback()` right after `import name` has run the module (one callback per name; a newer one replaces
    it).  The caller checks sys.modules first: a module imported already is not watched for."""
    _waiting[name] = callback
    if _WATCHER not in sys.meta_path:
        sys.meta_path.insert(0, _WATCHER)


def forget(name: str) -> None:
    _waiting.pop(name, None)
    if not _waiting:
        try:
            sys.meta_path.remove(_WATCHER)
        except ValueError:
            pass


def watching(name: str) -> bool:
    return name in _waiting and _WATCHER in sys.meta_path


class _Loader:
    """The module's own loader, plus the callback once the module has run."""

    def __init__(self, real, name: str) -> None:
        self._real, self._name = real, name

    def __getattr__(self, attr):
        return getattr(self._real, attr)

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._real.exec_module(module)
        finally:   # the module keeps its real loader, as if we had never been there
            module.__loader__ = self._real
            if getattr(module, "__spec__", None) is not None and module.__spec__.loader is self:
                module.__spec__.loader = self._real
        callback = _waiting.get(self._name)
        forget(self._name)
        if callback is None:
            return
        try:
            callback()
        except Exception as e:   # never fail the user's import
            callsite.warn(f"instrument: after `import {self._name}`: {e}")


class _Watcher:
    """A sys.meta_path finder that finds nothing but the moment a watched module is imported."""

    def find_spec(self, name, path=None, target=None):
        if name not in _waiting:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module") and not isinstance(spec.loader, _Loader):
            spec.loader = _Loader(spec.loader, name)
        return spec


_WATCHER = _Watcher()
