"""The hot path's implementation, chosen once at import: the C extension
(`instrument._native`) or its pure-Python twin (`instrument.live.pure`), which
have the same interface (`instrument/_native.pyi`).

`current` is the module in use; `use()` switches it (the tests run both)."""
from __future__ import annotations

from types import ModuleType
from typing import Callable, List, Optional

from .. import config

current: ModuleType
name: str
reason: Optional[str]
_listeners: List[Callable[[ModuleType], None]] = []


def _choose():
    if config.pure_python_requested():
        from . import pure
        return pure, "pure", config.PURE_PYTHON_REASON
    try:
        from .. import _native
        return _native, "native", None
    except ImportError as e:
        from . import pure
        return pure, "pure", f"C extension not importable: {e}"


def on_switch(listener: Callable[[ModuleType], None]) -> None:
    """Call `listener(module)` whenever the backend is switched."""
    _listeners.append(listener)


def use(module: ModuleType) -> None:
    """Switch the backend (tests run against both); listeners re-apply the configuration."""
    global current, name, reason
    current = module
    name = "native" if module.__name__.endswith("_native") else "pure"
    reason = "switched by instrument.live.backend.use()"
    for f in list(_listeners):
        f(module)


current, name, reason = _choose()
