"""The breakdown in a notebook (JupyterLab, VS Code, the classic Notebook).

A Snapshot shows as the HTML report (instrument.exporters.html) inline, and `%load_ext instrument` adds:

    %%instrument [STAGE]        run the cell as stage STAGE (default `cell`); show and return what it recorded
    %instrument_report [SNAP]   the report of SNAP (a variable holding a Snapshot, or a snapshot file);
                                without one, of everything recorded so far
    %instrument_diff A B        before A, after B (variables or files), each change tested against noise

The report is a whole HTML document, so it goes into an `<iframe srcdoc>`: its styles, element ids and script
stay in their own document (several outputs coexist, none restyles the notebook), the sandbox lets its script
run and nothing else, and nothing is fetched from anywhere.  This module is handed the facade's functions
(`load(ipython, snapshot, stage)`) and imports no live side.
"""
from __future__ import annotations

import html
import os
from typing import Any, Callable

from .analysis.diff import diff
from .analysis.verdict import with_verdicts
from .exporters import html as _report
from .exporters.format import headline
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

    @magics_class
    class InstrumentMagics(Magics):
        @cell_magic
        def instrument(self, line: str, cell: str) -> Snapshot:
            """%%instrument [STAGE]: run the cell as stage STAGE (default `cell`); show and return what it
            recorded (the window from before the cell to after it)."""
            name = line.strip() or "cell"
            try:
                recording = stage(name)
            except (TypeError, ValueError) as e:
                raise UsageError(f"%%instrument: {e}") from None
            before = snapshot()
            try:
                with recording:
                    self.shell.run_cell(cell, store_history=False).raise_error()
            except (Exception, KeyboardInterrupt):   # shown by run_cell already; counted as the stage's error
                pass
            after = snapshot()
            try:
                return with_verdicts(after.since(before))
            except SnapshotError:   # the cell reset the recording: all of it is the cell's
                return after

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
            return _Html(headline(diff(before, after)), diff_html(before, after))

    ipython.register_magics(InstrumentMagics)
