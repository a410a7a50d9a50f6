"""Formatting shared by every text form: numbers in their units, and stage names
that cannot move the cursor or break a table."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from ..analysis.metrics import Bar, Metric
from ..snapshot import Snapshot, StageStats, name_text, path_text as _path_text

MINUS = "\u2212"
ESTIMATE = "~"   # marks a figure estimated from the calls read under the overhead budget


def ms(ns: Optional[float]) -> str:
    """Nanoseconds as milliseconds, with as many decimals as the size wants."""
    if ns is None:
        return "n/a"
    v = ns / 1e6
    if v >= 10000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.01:
        return f"{v:.3f}"
    return f"{v:.4f}"


def pct(x: Optional[float]) -> str:
    """A fraction as a percentage number (0.123 -> 12.3)."""
    if x is None:
        return "n/a"
    v = 100 * x
    return f"{0.0 if round(v, 1) == 0 else v:.1f}"   # no "-0.0"


def ratio(x: Optional[float], digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if digits == 2 and x >= 9.995:   # keep to four characters
        return f"{x:.0f}" if x < 99.5 else "99+"
    return f"{x:.{digits}f}"


def number(x: Optional[float]) -> str:
    """A small quantity with about three digits: 0.25, 2.5, 250."""
    if x is None:
        return "n/a"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def human(ns: Optional[float]) -> str:
    """Three significant digits: 25.0 ms, 1.23 s, 850 µs."""
    if ns is None:
        return "n/a"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            break
    else:
        unit, scale = "ns", 1
    v = ns / scale
    digits = max(0, 2 - int(math.floor(math.log10(abs(v))))) if v else 0
    return f"{v:.{digits}f} {unit}"


def signed_percent(r: Optional[float]) -> str:
    """A ratio after/before as a signed change: 0.9 -> −10.0%."""
    if r is None:
        return "n/a"
    x = (r - 1) * 100
    sign = "+" if round(x, 1) > 0 else MINUS if round(x, 1) < 0 else "±"
    return f"{sign}{abs(x):.1f}%"


def count(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:,.0f}" if float(x).is_integer() else f"{x:.4g}"


def printable(name: str) -> str:
    """Control characters shown escaped, so a stage name cannot move the cursor."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def md(text: str) -> str:
    """Text for a markdown table cell (a backslash doubled, so an escaped '/' in a path stays shown)."""
    return (printable(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
            .replace(">", "&gt;"))


def path_text(path: Sequence[str]) -> str:
    """A path for display: names joined by '/', a '/' or '\\' inside a name escaped
    with '\\' (instrument.snapshot.path_text), control characters shown escaped."""
    return printable(_path_text(path))


def name(n: str) -> str:
    """One stage name for display, escaped as in a path."""
    return printable(name_text(n))


def unit(name: str) -> str:
    """An item name as a unit: tokens -> token, bytes -> byte, padding_tokens -> padding_token."""
    return name[:-1] if len(name) > 1 and name.endswith("s") and not name.endswith("ss") else name


def per_unit(ns: Optional[float], name: str) -> str:
    """Time per item: `2.51 µs/token`."""
    return "n/a" if ns is None else f"{human(ns)}/{printable(unit(name))}"


def si(x: Optional[float]) -> str:
    """A count with a metric prefix: 398000 -> 398k, 1234567 -> 1.23M."""
    if x is None:
        return "n/a"
    for p, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            v = x / scale
            break
    else:
        p, v = "", x
    digits = max(0, 2 - int(math.floor(math.log10(abs(v))))) if v else 0
    return f"{v:.{digits}f}{p}"


def rate(per_s: Optional[float], name: str) -> str:
    """Items per second: `398k tokens/s`."""
    return "n/a" if per_s is None else f"{si(per_s)} {printable(name)}/s"


#: the format kinds of instrument.analysis.metrics: a value's text by kind
KINDS: Dict[str, Callable[[Any], str]] = {
    "ms": ms, "pct": pct, "ratio": ratio, "ratio1": lambda x: ratio(x, 1), "int": lambda x: f"{x:.0f}",
    "number": number, "text": lambda x: printable(str(x)),
}


def metric_text(kind: str, value: Any) -> str:
    """A metric's value as text: `n/a` where not measured (text: empty), a Bar as `12.3±0.4`, components as
    `on_cpu 12.0 queue 3.0`."""
    if value is None:
        return "" if kind == "text" else "n/a"
    if isinstance(value, Bar):
        return f"{metric_text(kind, value.value)}\u00b1{metric_text(kind, value.error)}"
    if isinstance(value, Mapping):
        return " ".join(f"{printable(str(k))} {metric_text(kind, v)}" for k, v in value.items())
    return KINDS[kind](value)


def cell(m: Metric, snap: Snapshot, s: StageStats) -> str:
    """A stage's figure as a table shows it, marked with ESTIMATE when estimated from sampled calls."""
    text = metric_text(m.kind, m.value(snap, s))
    return ESTIMATE + text if text not in ("", "n/a") and m.estimated(s) else text
