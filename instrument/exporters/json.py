"""JSON of each view, for a program to read: the breakdown (each stage as the
snapshot records it, plus each metric's figure), the diff with its headline,
the tail, the advice and the ranks.  Times are in ns, `root_pct` and `tail_pct`
in percent; NaN is refused, so any JSON reader reads it."""
from __future__ import annotations

import json
from typing import Any, Dict, Optional, Sequence

from ..analysis import metrics as _metrics
from ..analysis.diff import Diff
from ..analysis.metrics import Metric
from ..analysis.ranks import RankView
from ..analysis.tail import TailView
from ..snapshot import Snapshot, StageStats
from .format import BREAKDOWN_OPTIONS, breakdown, choose_columns, headline

NAME = "json"
EXTENSION = ".json"
OPTIONS = BREAKDOWN_OPTIONS


def _row(snap: Snapshot, s: StageStats, cols: Sequence[Metric]) -> Dict[str, Any]:
    """The stage as the snapshot records it, plus each metric's field; where the record has that key (calls,
    verdict) the record's is kept: the same figure, or more of it (the verdict with its reason)."""
    d = s.to_dict()
    for k, v in _metrics.row(snap, s, list(cols)).items():
        d.setdefault(k, v)
    for item, it in d.get("items", {}).items():
        it.update(ns_per_item=s.per_item_ns(item), per_second=s.item_rate(item))
    return d


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, allow_nan=False)


def render(snaps: Sequence[Snapshot], sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
           columns: Optional[Sequence[str]] = None) -> str:
    """The breakdown as a JSON list, one object per stage in the breakdown's order.

    Several snapshots are merged into one breakdown."""
    snap, rows = breakdown(snaps, sort, depth, fold)
    cols, _ = choose_columns(snap, None, columns)
    return _dumps([_row(snap, s, cols) for s in rows])


def operators(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
              width: Optional[int] = None) -> str:
    """The breakdown; each stage's torch operators are in its record's `ops`."""
    return render([snap], sort, depth, fold)


def diff(d: Diff, limit: Optional[int] = None, width: Optional[int] = None) -> str:
    """The diff's basis, machine, tests and rows, with its headline."""
    rows = d.rows[:limit] if limit else d.rows
    return _dumps(dict(d.to_dict(), headline=headline(d), rows=[r.to_dict() for r in rows]))


def tail(views: Sequence[TailView], limit: Optional[int] = None, snap: Optional[Snapshot] = None) -> str:
    """One object per root stage, with the sentence that says why its slow calls were slow; a list when there
    are several."""
    objs = [dict(t.to_dict(), why=t.sentence(snap)) for t in views]
    return _dumps(objs[0] if len(objs) == 1 else objs)


def advice(items: Sequence[Dict[str, Any]], about: Optional[str] = None) -> str:
    """advise()'s list as it is."""
    return _dumps(list(items))


def ranks(view: RankView, width: Optional[int] = None) -> str:
    """The ranks view: ranks, straggler, and each stage's figures per rank."""
    return _dumps(view.to_dict())


VIEWS = {"diff": diff, "tail": tail, "advice": advice, "operators": operators, "ranks": ranks}
