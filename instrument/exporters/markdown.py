"""Markdown (GitHub-flavoured tables): the breakdown, the diff, the tail and the
torch operators, for a pull request or a notebook; every cell escaped so that a
stage name cannot break the table."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from ..analysis.diff import Diff
from ..analysis.tail import TailView
from ..snapshot import Snapshot, StageStats
from .format import (BREAKDOWN_OPTIONS, DIFF_HEADERS, NO_EXEMPLARS, TAIL_HEADERS, breakdown, cell, choose_columns,
                     diff_cells, diff_label, diff_notes, headline, item_lines, legend, md, name, no_ops_note,
                     path_text, tail_cells, tail_head, with_ops)

NAME = "markdown"
EXTENSION = ".md"
OPTIONS = BREAKDOWN_OPTIONS


def render(snaps: Sequence[Snapshot], sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
           columns: Optional[Sequence[str]] = None,
           below: Optional[Callable[[StageStats, str], List[str]]] = None) -> str:
    """The breakdown as a markdown table, each stage's items in a block after it.

    Several snapshots are merged into one breakdown.  columns: these metrics only; below(stage, indent): the
    lines after a stage's row (default: its items)."""
    snap, rows = breakdown(snaps, sort, depth, fold)
    cols, _ = choose_columns(snap, None, columns)
    below = below or item_lines
    lines = ["| stage | " + " | ".join(m.header for m in cols) + " |",
             "| --- | " + " | ".join("---:" for _ in cols) + " |"]
    notes = []
    for s in rows:
        stage = "&nbsp;" * (2 * s.depth) + md(name(s.name))
        lines.append(f"| {stage} | " + " | ".join(md(cell(m, snap, s)) for m in cols) + " |")
        extra = below(s, "    ")
        if extra:
            notes += ["", f"**{md(path_text(s.path))}**", "", "```", *extra, "```"]
    return "\n".join(lines + notes)


def operators(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
              width: Optional[int] = None) -> str:
    """The breakdown with each stage's items and torch operators after its row."""
    return render([snap], sort, depth, fold, below=with_ops) + no_ops_note(snap, width)


def tail(views: Sequence[TailView], limit: Optional[int] = 12, snap: Optional[Snapshot] = None) -> str:
    """The tail of each root stage: a bold head line, then its table of stages."""
    if not views:
        return NO_EXEMPLARS
    out: List[str] = []
    for v in views:
        cells = tail_cells(v, limit)
        out += [f"**{md(tail_head(v, snap))}**", "", "| " + " | ".join(TAIL_HEADERS) + " |",
                "| --- | ---: | ---: | ---: | ---: | --- |"]
        out += ["| " + " | ".join([md(c[0])] + c[1:]) + " |" for c in cells]
        out.append("")
    return "\n".join(out).rstrip("\n")


def diff(d: Diff, limit: Optional[int] = None, width: Optional[int] = None) -> str:
    """The diff: the headline in bold, a row per stage with its notes in its first cell, the legend."""
    rows = d.rows[:limit] if limit else d.rows
    out = [f"**{md(headline(d))}**", "", "| stage | " + " | ".join(DIFF_HEADERS) + " |",
           "| --- | " + " | ".join("---:" for _ in DIFF_HEADERS) + " |"]
    for r in rows:
        lines = diff_notes(r)
        extra = "<br>" + "<br>".join(md(x) for x in lines) if lines else ""
        out.append(f"| {md(diff_label(r))}{extra} | " + " | ".join(md(c) for c in diff_cells(r)) + " |")
    out += ["", "<br>".join(md(x) for x in legend(d))]
    return "\n".join(out)


VIEWS = {"diff": diff, "tail": tail, "operators": operators}
