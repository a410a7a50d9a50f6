"""What every module of the snapshot package shares: its error, stage paths as text, and the rules for numbers
(JSON integers, the 99 % interval of an estimate, sums and growth where a side may be unknown)."""
from __future__ import annotations

import contextlib
import gc
import math
from typing import Any, Iterator, Optional, Sequence, Tuple

Z99 = 2.5758293035489   # the normal quantile of a two-sided 99 % interval


class SnapshotError(ValueError):
    """A snapshot file or dict that cannot be read, with the reason."""


def name_text(name: str) -> str:
    """A stage name as it appears in a path: a '\\' or '/' inside it escaped with '\\'."""
    return name.replace("\\", "\\\\").replace("/", "\\/")


def path_text(path: Sequence[str]) -> str:
    """A path as one string: names joined by '/', each escaped by name_text, so a stage
    named "a/b" (`a\\/b`) never reads like "b" nested in "a" (`a/b`)."""
    return "/".join(name_text(n) for n in path)


def path_shown(path: Sequence[str]) -> str:
    """A path as people read it: names as written, joined by '/'; a name holding a '/' (or starting with '"') is
    shown in double quotes, a '"' inside doubled, so "POST /classify" reads `"POST /classify"` and never like
    "classify" nested in "POST " (`POST /classify`).  path_text is the form that keys and parses back."""
    return "/".join('"' + n.replace('"', '""') + '"' if "/" in n or n.startswith('"') else n for n in path)


def parse_path(text: str) -> Tuple[str, ...]:
    """The path a path_text string names (an unescaped '/' separates names)."""
    names, cur, k = [], [], 0
    while k < len(text):
        c = text[k]
        if c == "\\" and k + 1 < len(text) and text[k + 1] in "\\/":
            cur.append(text[k + 1])
            k += 2
            continue
        if c == "/":
            names.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        k += 1
    names.append("".join(cur))
    return tuple(names)


def as_path(path: Any) -> Tuple[str, ...]:
    """A path given as path_text or as a sequence of names."""
    return parse_path(path) if isinstance(path, str) else tuple(path)


def json_number(x: Any) -> Any:
    """A number as saved: a float with an integer value as an int (below 2 ** 53, where floats are exact)."""
    return None if x is None else (int(x) if isinstance(x, float) and x.is_integer() and abs(x) < 2 ** 53 else x)


def ci99(total: Optional[float], var: float, upper: Optional[float] = None) -> Optional[Tuple[float, float]]:
    """The 99 % interval of an estimated sum with this variance (normal approximation), within [0, upper]."""
    if total is None:
        return None
    half = Z99 * math.sqrt(var) if var > 0 else 0.0
    lo, hi = max(total - half, 0.0), total + half
    if upper is not None:
        hi = min(hi, max(upper, total))
    return (lo, max(hi, lo))   # an estimate below 0 (a difference of clocks) has an interval of [0, 0] at least


WINDOW_MEMORY = ("n", "w", "w_peak", "peak_sum", "peak_sq")   # a window's memory sums per source (diff's peaks)
MEMORY_SUMS = ("calls", "overlapped", "marked", "fresh", "w", "w_peak", "w_net", "peak_sum", "peak_sq", "net_sum", "net_sq")


def memory_sums(m: Any) -> dict:
    """A source's memory sums (StageStats.memory[source]) checked: MEMORY_SUMS numbers, and peak_max (None: not
    known, as after since() where the window's largest peak did not pass the earlier one)."""
    out = {k: float(m[k]) for k in MEMORY_SUMS}
    for k in ("calls", "overlapped", "marked", "fresh"):
        if out[k] < 0 or not out[k].is_integer():
            raise ValueError(f"memory {k} must be a whole number >= 0, got {m[k]!r}")
        out[k] = int(out[k])
    out["peak_max"] = None if m.get("peak_max") is None else float(m["peak_max"])
    return out


def uncounted() -> dict:
    """A counter's figures where no call counted it (the event could not be opened, or was never read)."""
    return {"total": None, "self": None, "counted_calls": 0, "read_calls": 0}


def counted_nothing(c: Any) -> bool:
    """Whether a counter's figures are those of `uncounted()`: no total, no call counted or read, no time enabled."""
    return c.get("total") is None and not c.get("counted_calls") and not c.get("read_calls") and not c.get("enabled_ns")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a bulk of objects that hold no cycles is built (a load, a merge):
    the passes their number alone would start find nothing to collect, and cost a tenth of a load."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def sum_known(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """a + b, or the one that is known (None when neither is)."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def growth(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """A sum's growth over a window, from `b` to `a`; never negative (estimates under the overhead budget may dip
    a little); `a` where `b` is unknown."""
    d = a if a is None or b is None else a - b
    return None if d is None else max(d, 0)
