"""The terminal text of `instrument report`: the per-stage breakdown as an indented
tree, one row per stage, and the text of each view (diff, tail, advice, torch
operators, ranks).

Columns appear when the snapshot has their data (counters, GPU time, verdicts);
the core set fits an 80-column terminal and extra columns are added while they
fit.  Each column is a metric of instrument.analysis.metrics.
"""
from __future__ import annotations

import shutil
import textwrap
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..analysis.diff import Diff
from ..analysis.metrics import wanted
from ..analysis.ranks import RankView, StageAcrossRanks
from ..analysis.tail import TailView
from ..snapshot import Snapshot, StageStats
from .format import (BREAKDOWN_OPTIONS, DIFF_HEADERS, ESTIMATE, NAME_MAX, NO_EXEMPLARS, TAIL_HEADERS, UNKNOWN,
                     breakdown, cell, choose_columns,
                     diff_cells, diff_label, diff_notes, headline, item_lines, label, legend, ms, name,
                     no_ops_note, path_text, printable, ranks_summary, tail_cells, tail_head, with_ops)

NAME = "table"
EXTENSION = ".txt"
OPTIONS = BREAKDOWN_OPTIONS


def render(snaps: Sequence[Snapshot], sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
           width: Optional[int] = None, columns: Optional[Sequence[str]] = None, title: Optional[str] = None,
           below: Optional[Callable[[StageStats, str], List[str]]] = None) -> str:
    """The breakdown as a text table, one row per stage, as `instrument report` prints it.

    Several snapshots are merged into one breakdown.  width: terminal columns (default: the terminal's,
    at least 80); columns: these metrics only; under each row go the stage's items with their per-item cost
    and rate, or what `below(stage, indent)` returns."""
    snap, rows = breakdown(snaps, sort, depth, fold)
    if width is None:
        width = max(80, shutil.get_terminal_size((80, 24)).columns)
    texts = {m.name: [cell(m, snap, s) for s in rows] for m in wanted(snap)}
    cols, dropped = choose_columns(snap, width, columns,
                            lambda m: max([m.column_width] + [len(t) for t in texts.get(m.name, ())]))
    below = below or item_lines
    widths = [max([m.column_width] + [len(t) for t in texts.get(m.name, ())]) for m in cols]
    name_w = max(10, min(NAME_MAX, width - sum(w + 1 for w in widths)))
    head = f"{'stage':<{name_w}}" + "".join(f" {m.header:>{w}}" for m, w in zip(cols, widths))
    lines = []
    if title:
        lines.append(title)
    lines += [head, "-" * len(head)]
    for s in rows:
        lines.append(f"{label(s, name_w):<{name_w}}" + "".join(f" {cell(m, snap, s):>{w}}" for m, w in zip(cols, widths)))
        lines += below(s, "  " * (s.depth + 2))
    if not rows:
        lines.append("(no stages recorded)")
    lines.append(f"{len(rows)} stages, {ms(snap.total_ns)} ms in top-level stages")
    overlapped = sum(s.overlapped_calls for s in rows)
    if overlapped:
        lines.append(f"{overlapped} calls overlapped other asyncio tasks on their thread with no task-switch hook: "
                     "their CPU time and counters are left out (n/a), never summed")
        why = (snap.meta.get("tasks") or {}).get("reason")
        if why:   # the loop or setting no hook reaches, and what to do about it
            lines += textwrap.wrap(f"  why: {why}", width, subsequent_indent="    ")
    sampled = [s for s in rows if s.cpu_estimated or any(c.get("estimated") for c in s.counters.values())]
    if sampled:
        reads = sum(s.cpu_reads for s in sampled)
        calls = sum(s.cpu_calls for s in sampled)
        lines += textwrap.wrap(f"{ESTIMATE} estimated: {len(sampled)} stage{'s' if len(sampled) != 1 else ''} too short "
                               "for a read on every call within "
                               f"the overhead budget had {reads:,} of {calls:,} calls read (overhead_budget=None reads "
                               f"every call); {UNKNOWN} where its error bar is wider than the figure", width)
    for note in (overhead_line(snap), backend_line(snap)):
        if note:
            lines += textwrap.wrap(note, width)
    if dropped:
        lines += textwrap.wrap(f"not shown at {width} columns: {', '.join(m.header for m in dropped)} (a wider "
                               "terminal, COLUMNS=160, or --format csv/json shows them)", width)
    return "\n".join(lines)


def backend_line(snap: Snapshot) -> Optional[str]:
    """Where a backend other than the C core recorded the snapshot: which, why, and what it lacks (meta.backend)."""
    b = snap.meta.get("backend")
    if not isinstance(b, dict) or not b.get("missing"):
        return None
    return f"recorded by the {b.get('name')} backend ({b.get('reason')}); it lacks: {', '.join(b['missing'])}"


def overhead_line(snap: Snapshot) -> Optional[str]:
    """The SDK's own estimated cost (meta.overhead) as a share of the wall time the snapshot recorded."""
    o = snap.meta.get("overhead")
    if not isinstance(o, dict) or o.get("estimated_ns") is None:
        return None
    total = snap.total_ns
    p = 100 * o["estimated_ns"] / total if total else None
    share = "" if p is None else f"{p:.0f} % of the recorded wall time; " if p >= 10 else \
        f"{p:.2g} % of the recorded wall time; "
    return (f"instrument's own cost: ~{ms(o['estimated_ns'])} ms ({share}{o.get('read_calls', 0):,} of "
            f"{o.get('calls', 0):,} calls read)")


def operators(snap: Snapshot, sort: str = "tree", depth: Optional[int] = None, fold: bool = False,
              width: Optional[int] = None) -> str:
    """The breakdown with each stage's items and torch operators under its row, saying so where none were
    recorded."""
    return render([snap], sort, depth, fold, width, below=with_ops) + no_ops_note(snap, width)


def tail(views: Sequence[TailView], limit: Optional[int] = 12, snap: Optional[Snapshot] = None) -> str:
    """Per root stage: how much more time each stage took in the calls above the quantile ("slow ms": their
    mean self time) than in a typical call, as time and as share of the excess, largest first, with the
    component of its time that grew most and one sentence that says it (naming the stages that held the
    event loop, from `snap`, where that was it)."""
    if not views:
        return NO_EXEMPLARS
    out: List[str] = []
    for v in views:
        cells = tail_cells(v, limit)
        hdr = TAIL_HEADERS
        w0 = min(48, max([len(hdr[0])] + [len(c[0]) for c in cells]))
        widths = [w0] + [max(len(hdr[i]), *(len(c[i]) for c in cells)) if cells else len(hdr[i]) for i in range(1, 6)]

        def line(c):
            first = c[0] if len(c[0]) <= w0 else c[0][: w0 - 1] + "…"
            return (f"{first:<{w0}}" + "".join(f" {x:>{w}}" for x, w in zip(c[1:5], widths[1:5]))
                    + f"  {c[5]:<{widths[5]}}").rstrip()
        out += [tail_head(v, snap), "", line(hdr), "-" * (sum(widths) + 6)] + [line(c) for c in cells]
        if len(v.excess) > len(cells):
            out.append(f"({len(v.excess) - len(cells)} more stages)")
        out.append("")
    return "\n".join(out).rstrip("\n")


def advice(items: Sequence[Dict[str, Any]], about: Optional[str] = None, width: Optional[int] = None) -> str:
    """instrument.analysis.advice.advise()'s list as text; `about` names the snapshot it
    judges (needed wherever two are on screen, as after a diff); width: each line wrapped to it."""
    lines = [f"Where to look next{' in ' + printable(about) if about else ''} (the stages with the most self time):"]
    for i, a in enumerate(items, 1):
        share = a["saving_upper_bound"]
        lines.append(f"{i}. {path_text(a['path'])}: {a['verdict']} — {a['reason']}")
        lines.append(f"   self {a['self_ns'] / 1e6:.2f} ms"
                     + (f"; removing it would save at most {share:.0%} of end-to-end time" if share is not None else ""))
        if a.get("tail"):
            lines.append(f"   in slow calls: {a['tail']['text']}")
        lines.append(f"   next: {a['next']}")
        if a.get("memory_next"):
            lines.append(f"   memory: {a['memory_next']}")
    if len(lines) == 1:
        lines.append("   (no stages recorded)")
    if width:
        lines = [w for x in lines for w in textwrap.wrap(x, width, break_long_words=False, break_on_hyphens=False,
                                                         subsequent_indent=" " * (len(x) - len(x.lstrip()) + 3))]
    return "\n".join(lines)


# Columns given up, group by group, when a diff table must fit a width: (indices into DIFF_HEADERS + 1, what the
# footer calls them, the header a column left alone in its group then takes)
_DIFF_DROPS = (((2, 3, 4, 5), "total ms before/after/Δ", {}), ((10, 11, 12), "p99 ms before/after/Δ%", {}),
               ((6, 7), "mean ms before/after", {8: "mean Δ%"}), ((13,), "CPU/call Δ%", {}), ((9,), "p50 Δ%", {}))


def diff(d: Diff, limit: Optional[int] = None, width: Optional[int] = None) -> str:
    """The diff as a text table; limit: at most that many rows; width: the table gives up columns (named in a
    footer) and wraps its notes to fit that many characters (`instrument diff`: the terminal's, at least 80)."""
    rows = d.rows[:limit] if limit else d.rows
    table = [[diff_label(r)] + diff_cells(r) for r in rows]
    head = ["stage"] + DIFF_HEADERS
    keep = list(range(len(head)))
    dropped: List[str] = []
    full = min(48, max([len(head[0])] + [len(t[0]) for t in table]))
    widths = [full] + \
        [max([len(h)] + [len(t[i + 1]) for t in table]) for i, h in enumerate(DIFF_HEADERS)]
    if width is not None:
        widths[0] = min(widths[0], max(16, width // 4))
        for group, what, rename in _DIFF_DROPS:
            if sum(widths[k] + 1 for k in keep) - 1 <= width:
                break
            keep = [k for k in keep if k not in group]
            dropped.append(what)
            for k, h in rename.items():
                head[k] = h
                widths[k] = max(widths[k], len(h))
        widths[0] = min(full, max(widths[0], width - sum(widths[k] + 1 for k in keep[1:])))   # room left: the names

    def line(cells):
        first = cells[0] if len(cells[0]) <= widths[0] else cells[0][: widths[0] - 1] + "…"
        return f"{first:<{widths[0]}}" + "".join(f" {cells[k]:>{widths[k]}}" for k in keep[1:])

    def wrap(text, indent=""):
        return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ") if width else \
            [indent + text]
    notes = legend(d)   # above the table: what it is based on (at most 2 lines at 80 columns); the rest below it
    if not d.machine.differed:   # alike machines: a footnote; machines that differed: said before any figure
        notes = [notes[0]] + notes[2:] + [notes[1]]
    above = 2 if d.machine.differed else 1
    out = [*wrap(headline(d)), *[x for n in notes[:above] for x in wrap(n)], "", line(head),
           "-" * (sum(widths[k] for k in keep) + len(keep) - 1)]
    for r, cells in zip(rows, table):
        out.append(line(cells))
        for x in diff_notes(r):
            out += wrap(x, "    ")
    if not rows:
        out.append("(no stages on either side)")
    else:
        out.append("")
        for x in notes[above:]:
            out += wrap(x)
    if dropped:
        out += wrap(f"not shown at {width} columns: {', '.join(dropped)} (a wider terminal or --format csv/json "
                    "shows them)")
    return "\n".join(out)


RANKS_WIDTH = 80


def _rank_label(x: StageAcrossRanks) -> str:
    return "  " * (len(x.path) - 1) + name(x.path[-1]) + ("ᵍ" if x.device else "")


def _rank_table(header: List[str], rows: List[List[str]], first: int) -> List[str]:
    widths = [first] + [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header) if i]

    def line(cells):
        c0 = cells[0] if len(cells[0]) <= first else cells[0][:first - 1] + "…"
        return (f"{c0:<{first}}" + "".join(f"  {c:>{w}}" for c, w in zip(cells[1:], widths[1:]))).rstrip()
    return [line(header), "-" * (sum(widths) + 2 * (len(widths) - 1))] + [line(r) for r in rows]


def ranks(view: RankView, width: Optional[int] = RANKS_WIDTH) -> str:
    """The ranks of a torch.distributed job: the summary, each stage's spread over the ranks per step, and a
    stage x rank table of time per step (as many ranks as fit `width`)."""
    width = width or RANKS_WIDTH
    out = [w for line in ranks_summary(view) for w in textwrap.wrap(line, width, subsequent_indent="  ")]
    first = min(36, max(len(_rank_label(x)) for x in view.stages) if view.stages else 10)
    spread = [[_rank_label(x), ms(x.low), ms(x.median), ms(x.high), str(x.slowest) if x.high > x.low else "",
               ms(x.mean_wait) if x.wait is not None else ""] for x in view.stages]
    out += [""] + _rank_table(["ms per step", "min", "median", "max", "slowest", "mean wait"], spread, first)
    cell_w = max([8] + [len(ms(v)) + 1 for x in view.stages for v in x.per_step.values()])
    fit = max(1, (width - first) // (cell_w + 2))
    shown = list(view.ranks[:fit])
    grid = [[_rank_label(x)] + [("" if r not in x.per_step else ("*" if r == x.slowest and x.high > x.low else "")
                                 + ms(x.per_step[r])) for r in shown] for x in view.stages]
    out += [""] + _rank_table(["ms per step"] + [f"rank {r}" for r in shown], grid, first)
    notes = ["* the slowest rank"]
    if any(x.device for x in view.stages):
        notes.append("ᵍ device time (CUDA events)")
    if len(view.ranks) > len(shown):
        notes.append(f"ranks {view.ranks[len(shown)]}..{view.ranks[-1]} left out for the width (--json has all)")
    out.append("(" + "; ".join(notes) + ")")
    return "\n".join(out)


VIEWS = {"diff": diff, "tail": tail, "advice": advice, "operators": operators, "ranks": ranks}
