"""The breakdown in a notebook (JupyterLab, VS Code, the classic Notebook).

A Snapshot shows as the HTML report (instrument.exporters.html) inline, and `%load_ext instrument` adds:

    %%instrument [NAME] [-n N] [--stage STAGE]
                                run the cell N times (default 1), each a call of stage STAGE (default `cell`);
                                show and return what it recorded, kept as NAME in the notebook's namespace
    %instrument_report [SNAP]   the report of SNAP (a variable holding a Snapshot, or a snapshot file);
                                without one, of everything recorded so far
    %instrument_diff A B        before A, after B (variables or files), each change tested against noise; where
                                the cells' calls are too few to judge, it says so and how many would do

The report is a whole HTML document, so it goes into an `<iframe srcdoc>`: its styles, element ids and script
stay in their own document (several outputs coexist, none restyles the notebook), the sandbox lets its script
run and nothing else, and nothing is fetched from anywhere.  This module is handed the facade's functions
(`load(ipython, snapshot, stage)`) and imports no live side.
"""
from __future__ import annotations

import argparse
import html
import math
import os
import shlex
from typing import Any, Callable, List, Optional

from .analysis.diff import Diff, diff, metric_text
from .analysis.significance import needed
from .analysis.verdict import with_verdicts
from .exporters import html as _report
from .exporters.format import headline, relative
from .snapshot import Snapshot, SnapshotError

ROW_PX = 34          # a table row of the report
MAX_PX = 1000        # taller reports scroll inside their frame


def frame(page: str, stages: int, depth: int, tails: int) -> str:
    """A report page inline: an iframe holding it, tall enough for its `stages` rows, an icicle `depth` deep and
    `tails` tail tables."""
    height = min(MAX_PX, 330 + 28 * depth + ROW_PX * stages + (260 if tails else 0))
    return (f'<iframe class="instrument-report" title="instrument report" sandbox="allow-scripts" '
            f'style="width:100%;height:{height}px;border:0" srcdoc="{html.escape(page, quote=True)}"></iframe>')


def snapshot_html(snap: Snapshot) -> str:
    """The report of one snapshot, inline (Snapshot._repr_html_)."""
    return frame(_report.render([snap]), len(snap), max((s.depth + 1 for s in snap), default=1), len(snap.roots))


def diff_html(before: Snapshot, after: Snapshot) -> str:
    """The before/after report of two snapshots, inline."""
    both = {s.path for s in before} | {s.path for s in after}
    return frame(_report.render([before, after], diff=True), len(both), max((len(p) for p in both), default=1), 0)


JUDGE_CALLS = 5      # calls a side below which a cell's spread is not measured: %instrument_diff cannot judge
JUDGE_CHANGE = 0.10  # the rise %instrument_diff says how many calls would show


def cannot_judge(d: Diff) -> Optional[str]:
    """Where the cells' stages (the top-level ones on both sides) had too few calls to judge a rise of
    JUDGE_CHANGE: the line that says so and how many calls a side would do (`%%instrument -n N`); None where
    each could."""
    said: List[str] = []
    roots = [r for r in d.rows if len(r.path) == 1 and r.status == "both"]
    for r in roots:
        calls = min(r.metrics["calls"].before or 0, r.metrics["calls"].after or 0)
        if calls < JUDGE_CALLS:
            said.append(f"{r.name}: {calls:.0f} call{'s' if calls != 1 else ''} a side measure no spread, so no "
                        f"change can be judged; run each cell {JUDGE_CALLS} times or more (%%instrument -n "
                        f"{JUDGE_CALLS}) and the diff says how many calls would do")
            continue
        blind = [(k, t) for k, t in r.judged if (t.detectable or 0) > JUDGE_CHANGE and not t.significant]
        if not blind:
            continue
        k, t = max(blind, key=lambda x: x[1].detectable)
        factor = needed(t, JUDGE_CHANGE)[1]
        more = f"about {math.ceil(factor * calls)} calls a side would (%%instrument -n {math.ceil(factor * calls)})" \
            if factor is not None else "more calls would not: what bounds it is the machine's own drift from one " \
            "cell to the next (the diff's basis says how much); a stage of the same calls whose code did not " \
            "change, passed as instrument.diff(..., reference=STAGE), takes it out"
        said.append(f"{r.name}: cannot judge a rise under {relative(t.detectable)} of {metric_text(k)} from "
                    f"{calls:.0f} calls a side; to show {relative(JUDGE_CHANGE)}, {more}")
    return "; ".join(said) or None


class _Html:
    """What a magic returns for the notebook to show: its HTML, and a line of text where HTML is not shown."""

    def __init__(self, text: str, page: str) -> None:
        self.text, self.page = text, page

    def _repr_html_(self) -> str:
        return self.page

    def __repr__(self) -> str:
        return self.text


def load(ipython: Any, snapshot: Callable[[], Snapshot], stage: Callable[[str], Any]) -> None:
    """Register the magics on `ipython` (an InteractiveShell), recording through the facade's `snapshot` and
    `stage`."""
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

    def find(word: str, magic: str) -> Snapshot:
        value = ipython.user_ns.get(word)
        if isinstance(value, Snapshot):
            return value
        if value is None and os.path.isfile(word):
            try:
                return Snapshot.load(word)
            except SnapshotError as e:
                raise UsageError(f"%{magic}: {e}") from None
        raise UsageError(f"%{magic}: {word!r} is neither a variable holding a Snapshot nor a snapshot file")

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):   # a UsageError (one line), not an exit
            raise ValueError(f"{message} (usage: %%instrument [NAME] [-n N] [--stage STAGE])")
    parser = Parser(prog="%%instrument", add_help=False)
    parser.add_argument("name", nargs="?")
    parser.add_argument("-n", type=int, default=1)
    parser.add_argument("--stage", default="cell")

    @magics_class
    class InstrumentMagics(Magics):
        @cell_magic
        def instrument(self, line: str, cell: str) -> Snapshot:
            """%%instrument [NAME] [-n N] [--stage STAGE]: run the cell N times (default 1), each a call of stage
            STAGE (default `cell`); show and return what it recorded (the window from before the cell to after
            it), kept as NAME in the notebook's namespace where one is given."""
            try:
                a = parser.parse_args(shlex.split(line))
                if a.name is not None and not a.name.isidentifier():
                    raise ValueError(f"NAME (the variable the snapshot is kept in) must be a Python name, got "
                                     f"{a.name!r}; --stage {a.name} names the stage")
                held = self.shell.user_ns.get(a.name) if a.name is not None else None
                if held is not None and not isinstance(held, Snapshot):
                    raise ValueError(f"{a.name} already holds a {type(held).__name__}, which NAME (the variable the "
                                     f"snapshot is kept in) would replace; pick another NAME, or --stage {a.name} "
                                     "to name the stage")
                if a.n < 1:
                    raise ValueError(f"-n (how many times to run the cell) must be 1 or more, got {a.n}")
                recording = stage(a.stage)
            except (TypeError, ValueError) as e:
                raise UsageError(f"%%instrument: {e}") from None
            before = snapshot()
            for k in range(a.n):
                try:
                    with recording:   # the first run shows its output; the repeats run silent
                        self.shell.run_cell(cell, store_history=False, silent=k > 0).raise_error()
                except (Exception, KeyboardInterrupt):   # shown by run_cell already; counted as the stage's error
                    break
            after = snapshot()
            try:
                got = with_verdicts(after.since(before))
            except SnapshotError:   # the cell reset the recording: all of it is the cell's
                got = after
            if a.name is not None:
                self.shell.user_ns[a.name] = got
            return got

        @line_magic
        def instrument_report(self, line: str) -> Snapshot:
            """%instrument_report [SNAP]: the report of SNAP (a variable or a snapshot file); without one, of
            everything recorded so far."""
            words = line.split()
            if len(words) > 1:
                raise UsageError(f"%instrument_report takes at most one snapshot (a variable or a file), got "
                                 f"{len(words)}: {line.strip()}")
            return find(words[0], "instrument_report") if words else snapshot()

        @line_magic
        def instrument_diff(self, line: str) -> _Html:
            """%instrument_diff BEFORE AFTER: the second snapshot against the first (variables or files), each
            change tested against noise."""
            words = line.split()
            if len(words) != 2:
                raise UsageError(f"%instrument_diff compares two snapshots, BEFORE AFTER (variables holding a "
                                 f"Snapshot, or snapshot files); got {len(words)}")
            before, after = (find(w, "instrument_diff") for w in words)
            d = diff(before, after)
            note = cannot_judge(d)
            if note is None:
                return _Html(headline(d), diff_html(before, after))
            return _Html(f"{headline(d)}\n{note}",
                         f'<p class="instrument-note">{html.escape(note)}</p>' + diff_html(before, after))

    ipython.register_magics(InstrumentMagics)
