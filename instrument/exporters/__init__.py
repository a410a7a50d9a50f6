"""One module per format, each with one contract:

    NAME = "chrome"                  # `instrument export --chrome OUT`, `instrument report --format chrome`
    EXTENSION = ".json"              # of the file it writes
    OPTIONS = (Option("indent", "...", metavar="N"),)   # render's options, offered as export flags (may be absent)
    VIEWS = {"diff": render_diff}    # the views (VIEW_NAMES) it renders besides snapshots (may be absent)

    def render(snaps: Sequence[Snapshot], **options) -> str:
        '''First line: what the format is.  The rest says what it does with more than one snapshot.'''

`formats()` finds the modules of this package that declare a NAME, then those
given to `register()`; the command line builds `instrument export`'s flags and
`report --format` from it.  A view (a diff, the tail, the advice, the torch
operators, the ranks) is one `View` whose formats are those that list it in
their VIEWS: `DIFF.render(d, "csv")`; `instrument diff --format` and the report's
views offer those.  Formats read Snapshots only (and `analysis` where they need
verdicts or a diff); a bad input is a ValueError with one line, a missing
optional package an ImportError saying what to install.  The shared formatting
(format.py) is not a format.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ..snapshot import Snapshot, merge_all

VIEW_NAMES = ("diff", "tail", "advice", "operators", "ranks")   # what a format may render besides snapshots

@dataclass(frozen=True)
class Option:
    name: str                        # render's keyword; `--name` on the command line
    help: str
    metavar: Optional[str] = None    # None: a flag (True when given); else it takes a value shown as this
    parse: Optional[Callable[[str], Any]] = None   # the value from its command-line text (None: the text itself);
    #                                                ValueError with what is allowed when it is not one


@dataclass(frozen=True)
class Format:
    name: str
    extension: str
    render: Callable[..., str]
    summary: str                     # the first line of render's docstring
    options: Tuple[Option, ...] = ()
    views: Mapping[str, Callable[..., str]] = field(default_factory=dict)   # view name -> its render in this format

    @classmethod
    def of(cls, module: Any) -> "Format":
        """The format a module (or any object with NAME, EXTENSION, render and maybe OPTIONS) declares."""
        missing = [a for a in ("NAME", "EXTENSION", "render") if not hasattr(module, a)]
        if missing:
            raise TypeError(f"{getattr(module, '__name__', module)!r} is not a format: it has no "
                            f"{', '.join(missing)}")
        doc = (module.render.__doc__ or "").strip()
        views = dict(getattr(module, "VIEWS", {}))
        unknown = sorted(set(views) - set(VIEW_NAMES))
        if unknown:
            raise TypeError(f"{module.NAME!r} renders unknown views {', '.join(unknown)}; the views are: "
                            f"{', '.join(VIEW_NAMES)}")
        return cls(module.NAME, module.EXTENSION, module.render, doc.splitlines()[0] if doc else module.NAME,
                   tuple(getattr(module, "OPTIONS", ())), views)


_formats: Dict[str, Format] = {}


def formats() -> Dict[str, Format]:
    """Every format by name: this package's (found on first use; table, the default, first, then by name), then
    the registered ones."""
    if not _formats:
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: (m.name != "table", m.name)):
            module = importlib.import_module(f"{__name__}.{info.name}")
            if hasattr(module, "NAME"):
                _formats[module.NAME] = Format.of(module)
    return _formats


def register(module: Any) -> Format:
    """Add a format (a module or object as described above); its name must be new."""
    f = Format.of(module)
    if f.name in formats():
        raise ValueError(f"a format named {f.name!r} exists already")
    _formats[f.name] = f
    return f


def snapshots(snaps: Sequence[Snapshot]) -> Sequence[Snapshot]:
    """`snaps` checked: a non-empty sequence of Snapshots (a single Snapshot is a mistake, said in one line)."""
    if isinstance(snaps, Snapshot) or not all(isinstance(s, Snapshot) for s in snaps):
        raise TypeError("render takes a sequence of Snapshots, such as [snap]")
    if not snaps:
        raise ValueError("no snapshot given")
    return snaps


def merged(snaps: Sequence[Snapshot]) -> Snapshot:
    """One snapshot of several: their exact merge (instrument.snapshot.merge_all)."""
    snaps = snapshots(snaps)
    return snaps[0] if len(snaps) == 1 else merge_all(snaps)


@dataclass(frozen=True)
class View:
    """One thing to show besides a snapshot's breakdown, in each format that renders it."""
    name: str        # a VIEW_NAMES entry: the key formats list it under in their VIEWS
    shows: str       # what render takes

    def formats(self) -> Tuple[str, ...]:
        return tuple(f.name for f in formats().values() if self.name in f.views)

    def render(self, obj: Any, format: str = "table", **options: Any) -> str:
        """`obj` in `format` (one of formats()), with that format's options for this view."""
        f = formats().get(format)
        if f is None or self.name not in f.views:
            raise ValueError(f"format must be one of {', '.join(self.formats())}, got {format!r}")
        return f.views[self.name](obj, **options)


DIFF = View("diff", "an instrument.analysis.diff.Diff")
TAIL = View("tail", "the TailViews of instrument.analysis.tail.tail(snap); snap= names the stages that held the "
            "event loop")
ADVICE = View("advice", "the list of instrument.analysis.advice.advise(snap); about= names the snapshot")
OPERATORS = View("operators", "a Snapshot: the breakdown with each stage's torch operators under its row")
RANKS = View("ranks", "an instrument.analysis.ranks.RankView")
