"""The stage tree in Hatchet's literal format, for call-tree analysis with llnl-hatchet.

    open("tree.json", "w").write(render([snap]))
    gf = hatchet.GraphFrame.from_literal(json.load(open("tree.json")))

Every node carries the same metrics (Hatchet takes the metric names from one
node): "time (inc)" and "time" (self) in seconds, "calls", "errors",
"cpu (inc)" seconds, each perf counter's total, and "items: NAME" for each item
added with `instrument.add` (null where a stage has none).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Sequence

from ..snapshot import Snapshot, StageStats
from . import merged

NAME = "hatchet"
EXTENSION = ".json"


def to_literal(snap: Snapshot) -> List[Dict[str, Any]]:
    events = list(dict.fromkeys(e for s in snap for e in s.counters))
    items = list(dict.fromkeys(n for s in snap for n in s.items))

    def node(s: StageStats) -> Dict[str, Any]:
        m: Dict[str, Any] = {"time (inc)": s.wall_total / 1e9, "time": s.wall_self / 1e9, "calls": s.calls,
                             "errors": s.errors, "cpu (inc)": None if s.cpu_total is None else s.cpu_total / 1e9}
        for e in events:
            m[e] = s.counter(e)
        for n in items:
            m[f"items: {n}"] = s.item_total(n)
        d: Dict[str, Any] = {"frame": {"name": s.name, "type": "function"}, "metrics": m}
        kids = snap.children(s.path)
        if kids:
            d["children"] = [node(k) for k in kids]
        return d
    return [node(r) for r in snap.roots]


def render(snaps: Sequence[Snapshot]) -> str:
    """Hatchet's literal format (`GraphFrame.from_literal`) as JSON.

    Several snapshots are merged into one tree."""
    return json.dumps(to_literal(merged(snaps)), allow_nan=False)
