"""The hot path's implementation, chosen once at import: the C extension
(`instrument._native`), the recorder, or where it cannot be imported the small
pure-Python fallback (`instrument.live.pure`), which implements the stage
interface of `instrument/_native.pyi` with exact sums and lacks what `pure.MISSING`
names.

`current` is the module in use; `use()` switches it (the tests run both);
`describe()` is what meta.backend and doctor say of it."""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, List, Optional

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


def describe() -> Dict[str, Any]:
    """The backend in use, why, and what it lacks against the C core (meta.backend, doctor, the report's footer)."""
    return {"name": name, "reason": reason, "missing": list(getattr(current, "MISSING", ()))}


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
