"""The one interface between the collector and its integrations (asyncio task
attribution, the torch watch, torch profiler ranges and attribution, GPU time
from CUDA events).

An integration is a module with a `name` (its key in Snapshot.meta) and any of
these functions, called by the collector at the matching moments and nothing
else: `configure(cfg)` (at import and every configure()), `status(raw)` (what
meta says of it; None: nothing), `before_snapshot()`, `stage_fields()` (extra
StageStats fields per stage path), `reset()`, `after_fork_child()`.  A function it
does not define does nothing.  None of them may raise into the user's program:
the collector catches and reports.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, List

_registered: Dict[str, ModuleType] = {}


def register(integration: ModuleType) -> None:
    _registered.setdefault(integration.name, integration)


def registered() -> List[ModuleType]:
    return list(_registered.values())


def call(integration: ModuleType, method: str, *args: Any) -> Any:
    """integration.method(*args), or None when it does not define it."""
    f = getattr(integration, method, None)
    return f(*args) if f is not None else None

