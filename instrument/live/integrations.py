"""The one interface between the collector and its integrations (torch profiler
ranges and attribution, GPU time from CUDA events).

An integration is registered once it has something to say; the collector then
calls these methods, and nothing else, at the matching moments.  None of them
may raise into the user's program: the collector catches and reports.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple


class Integration:
    """Base class: every method does nothing until overridden."""
    name = "integration"   # its key in Snapshot.meta

    def status(self) -> Dict[str, Any]:
        """What meta says of it."""
        return {}

    def before_snapshot(self) -> None:
        """Resolve what is pending, so the snapshot about to be taken is complete."""

    def stage_fields(self) -> Dict[Tuple[str, ...], Dict[str, Any]]:
        """Extra StageStats fields per stage path (`gpu`, `ops`)."""
        return {}

    def reset(self) -> None:
        """Forget what was recorded (instrument.reset())."""

    def after_fork_child(self) -> None:
        """In a forked child: drop what belongs to the parent."""


_registered: Dict[str, Integration] = {}


def register(integration: Integration) -> None:
    _registered.setdefault(integration.name, integration)


def registered() -> List[Integration]:
    return list(_registered.values())
