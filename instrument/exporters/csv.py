"""CSV, one row per stage (the breakdown) or per stage of a diff, with raw
numbers (times in ns, percentages as numbers) for a spreadsheet or pandas;
Python's csv module reads it back.  `path` is the stage's key (instrument.snapshot.path_text: a '/' inside a
name escaped, parse_path reads it back), `stage` its name as written."""
from __future__ import annotations

import csv
import io
from typing import Any, List, Optional, Sequence

from ..analysis.diff import ROW_VALUES, Diff
from ..analysis.significance import Significance
from ..snapshot import Snapshot, path_text
from .format import BREAKDOWN_OPTIONS, breakdown, choose_columns, item_names

NAME = "csv"
EXTENSION = ".csv"
OPTIONS = BREAKDOWN_OPTIONS


def render(snaps: Sequence[Snapshot], sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
           columns: Optional[Sequence[str]] = None) -> str:
    """The breakdown as CSV: a row per stage, each metric's fields, each item's total, ns per item and rate.

    Several snapshots are merged into one breakdown."""
    snap, rows = breakdown(snaps, sort, depth, fold)
    cols, _ = choose_columns(snap, None, columns)
    names = item_names(snap)
    cells = [{k: v for m in cols for k, v in m.fields(m.value(snap, s)).items()} for s in rows]
    fields = list(dict.fromkeys(k for c in cells for k in c)) if cells else [m.field for m in cols]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["path", "stage"] + fields + [h for n in names for h in (n, f"ns/{n}", f"{n}/s")])
    for s, c in zip(rows, cells):
        w.writerow([path_text(s.path), s.name] + [c.get(f) for f in fields]
                   + [v for n in names for v in (s.item_total(n), s.per_item_ns(n), s.item_rate(n))])
    return buf.getvalue()


TESTS = ["judgement", "basis", "estimate_pct", "interval_low_pct", "interval_high_pct", "p"]
FIGURES = ("cpu", "wall")


def _test_cells(sig: Significance) -> List[Any]:
    lo, hi = sig.interval_list() or (None, None)
    pct_ = (lambda x: None if x is None else 100 * x)
    return [pct_(sig.estimate), pct_(lo), pct_(hi), sig.p]


def _blank(values: List[Any]) -> List[Any]:
    return ["" if v is None else v for v in values]


def diff(d: Diff, limit: Optional[int] = None, width: Optional[int] = None) -> str:
    """The diff as CSV: per stage each figure before, after, delta and ratio, the test that judged it, the CPU
    and wall tests and the counters."""
    rows = d.rows[:limit] if limit else d.rows
    buf = io.StringIO()
    w = csv.writer(buf)
    names = list(dict.fromkeys(n for r in rows for n in r.counters))

    def head(m: str, k: str) -> str:
        return f"{m}_{k}" if m == "calls" or k == "ratio" else f"{m}_{k}_ns"
    w.writerow(["path", "stage", "status"]
               + [head(m, k) for m in ROW_VALUES for k in ("before", "after", "delta", "ratio")]
               + TESTS + [f"{f}_{k}" for f in FIGURES for k in ("significant", "evidence", "estimate_pct",
                                                                 "interval_low_pct", "interval_high_pct")]
               + [f"counter:{n}_{k}" for n in names for k in ("before", "after")])
    for r in rows:
        vals = [v for m in ROW_VALUES for v in r.metrics[m].to_dict().values()]
        sig = r.significance
        figures = []
        for f in FIGURES:
            t = r.tests.get(f)
            figures += ([t.significant and f not in r.not_evidence, f not in r.not_evidence]
                        + _test_cells(t)[:3] if t is not None else [None] * 5)
        cs = [v for n in names for v in ((r.counters[n].before, r.counters[n].after) if n in r.counters
                                        else (None, None))]
        w.writerow([path_text(r.path), r.path[-1], r.status] + _blank(vals)
                   + _blank([r.judgement, sig.basis] + _test_cells(sig))
                   + _blank(figures) + _blank(cs))
    return buf.getvalue()


VIEWS = {"diff": diff}
