"""One module per format, each with one contract:

    NAME = "chrome"                  # `instrument export --chrome OUT`
    EXTENSION = ".json"              # of the file it writes
    OPTIONS = (Option("indent", "...", metavar="N"),)   # render's options, offered as export flags (may be absent)

    def render(snaps: Sequence[Snapshot], **options) -> str:
        '''First line: what the format is.  The rest says what it does with more than one snapshot.'''

`formats()` finds the modules of this package that declare a NAME, then those
given to `register()`; the command line builds `instrument export`'s flags from
it.  Formats read Snapshots only (and `analysis` where they need verdicts or a
diff); a bad input is a ValueError with one line, a missing optional package an
ImportError saying what to install.  The text forms of `instrument report`
(table.py, ranks.py) and the shared formatting (format.py) are not formats.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ..snapshot import Snapshot, merge_all


@dataclass(frozen=True)
class Option:
    name: str                        # render's keyword; `--name` on the command line
    help: str
    metavar: Optional[str] = None    # None: a flag (True when given); else it takes a value shown as this


@dataclass(frozen=True)
class Format:
    name: str
    extension: str
    render: Callable[..., str]
    summary: str                     # the first line of render's docstring
    options: Tuple[Option, ...] = ()

    @classmethod
    def of(cls, module: Any) -> "Format":
        """The format a module (or any object with NAME, EXTENSION, render and maybe OPTIONS) declares."""
        missing = [a for a in ("NAME", "EXTENSION", "render") if not hasattr(module, a)]
        if missing:
            raise TypeError(f"{getattr(module, '__name__', module)!r} is not a format: it has no "
                            f"{', '.join(missing)}")
        doc = (module.render.__doc__ or "").strip()
        return cls(module.NAME, module.EXTENSION, module.render, doc.splitlines()[0] if doc else module.NAME,
                   tuple(getattr(module, "OPTIONS", ())))


_formats: Dict[str, Format] = {}


def formats() -> Dict[str, Format]:
    """Every format by name: this package's (found on first use), then the registered ones."""
    if not _formats:
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
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
