"""`instrument top URL`: a live view of a running process's stages.

Reads only Snapshots, fetched over HTTP from the process's `/snapshot` (served by
`instrument.serve_metrics(port)` or the `serve` option's variable); never the live
side.  Every `interval` seconds it takes the window between the last two snapshots
(`Snapshot.since`: counts, sums and histograms subtracted exactly; for the merge of
several workers, the same per stage) and shows per stage the window's calls/s,
p50/p99, CPU/wall, counters and verdict: the metrics of instrument.analysis.metrics,
as many as the width allows.

    instrument top 127.0.0.1:9464 [--interval 2] [--sort total|calls|p50|p99|cpu_per_wall|name|tree|...]
    instrument top URL --once --json      # one window as snapshot JSON, for scripts

Keys: t total, c calls, m p50 (median), p p99, u CPU/wall, n name, r tree order, q quit.
"""
from __future__ import annotations

import json
import os
import select
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from . import config
from .analysis.metrics import METRICS, Metric, ordered
from .analysis.verdict import with_verdicts
from .exporters.format import ESTIMATE, cell, dominant, label
from .snapshot import Snapshot, SnapshotError

MAX_BODY = 80 << 20           # above what /snapshot ever sends (64 MiB)
KEYS = {"t": "total", "c": "calls", "m": "p50", "p": "p99", "u": "cpu_per_wall", "n": "name", "r": "tree"}
WIDTH = 80


class TopError(Exception):
    """One line: what went wrong with the URL; the command exits 2."""


# ------------------------------------------------------------------ fetching
def snapshot_url(url: str) -> str:
    """127.0.0.1:9464, 9464, http://host:port -> http://host:port/snapshot; a URL with a path is kept."""
    text = url.strip()
    if text.isdigit():
        text = f"127.0.0.1:{text}"
    if "://" not in text:
        text = "http://" + text
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise TopError(f"{url}: not an http URL (give host:port or http://host:port/snapshot)")
    try:
        u.port
    except ValueError:
        raise TopError(f"{url}: the port is not a number from 0 to 65535") from None
    path = u.path if u.path not in ("", "/") else "/snapshot"
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, u.query, ""))


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # a local service: never through a proxy


def fetch(url: str, timeout: float = 10.0) -> Snapshot:
    """The Snapshot that `url` serves; TopError with the reason when it serves none."""
    try:
        with _opener.open(urllib.request.Request(url, headers={"Accept": "application/json"}), timeout=timeout) as r:
            body = r.read(MAX_BODY + 1)
            ctype = r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        detail = ""
        try:
            detail = json.loads(e.read(4096).decode("utf-8")).get("error", "")
        except Exception:
            pass
        raise TopError(f"{url} answered HTTP {e.code} ({e.reason}){': ' + detail if detail else ''}"
                       f"{'' if detail else ': not an instrument /snapshot endpoint'}") from None
    except urllib.error.URLError as e:
        reason = e.reason
        why = getattr(reason, "strerror", None) or str(reason)
        if isinstance(reason, ConnectionRefusedError):
            why = (f"connection refused (is the service running and serving, with {config.env_name('serve')}="
                   "host:port or instrument.serve_metrics(port)?)")
        raise TopError(f"cannot reach {url}: {why}") from None
    except TimeoutError:
        raise TopError(f"{url} did not answer within {timeout:g} s") from None
    except (OSError, ValueError) as e:   # reset connections, malformed answers
        raise TopError(f"{url}: {type(e).__name__}: {getattr(e, 'strerror', None) or e or 'no answer'}") from None
    except Exception as e:   # http.client.HTTPException: a server that does not speak HTTP
        raise TopError(f"{url} did not answer in HTTP: {type(e).__name__} {e}") from None
    if len(body) > MAX_BODY:
        raise TopError(f"{url} answered more than {MAX_BODY} bytes: not an instrument /snapshot endpoint")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        kind = ctype.split(";")[0].strip() or "no content type"
        raise TopError(f"{url} answered something that is not JSON ({kind}, {len(body)} bytes): not an instrument "
                       "snapshot") from None
    try:
        return Snapshot.from_dict(data)
    except SnapshotError as e:
        raise TopError(f"{url} answered JSON that is not an instrument snapshot: {e}") from None


# -------------------------------------------------------------------- window
def window(later: Snapshot, earlier: Snapshot) -> Snapshot:
    """What happened between two snapshots of one service (`later.since(earlier)`: one process, or a
    merge of workers in which every process of `earlier` is still there).  SnapshotError otherwise
    (a restart or reset: start a new window)."""
    return later.since(earlier)


def seconds(win: Snapshot, measured: float) -> float:
    """The window's length: the snapshots' own clock when one process recorded it, else as measured here."""
    d = (win.meta.get("window") or {}).get("duration_ns")
    return d / 1e9 if d else measured


# ---------------------------------------------------------------------- rows
class Column(NamedTuple):
    header: str
    width: int
    text: Callable[[Snapshot, Any, float, Dict[tuple, int]], str]   # (window, stage, window seconds, held())


def _metric(name: str) -> Column:
    m: Metric = METRICS[name]
    return Column(m.header, m.column_width, lambda win, s, t, tot: cell(m, win, s))


def held(win: Snapshot) -> Dict[tuple, int]:
    """Per stage, the wall time it held in the window: its completed calls' time, and at least what its children
    took (a call still open at the window's end holds children that finished in it), so no child exceeds its
    parent."""
    out: Dict[tuple, int] = {}

    def walk(s) -> int:
        out[s.path] = max(s.wall_total, sum(walk(k) for k in win.children(s.path)))
        return out[s.path]
    for root in win.roots:
        walk(root)
    return out


def _window_columns() -> List[Column]:
    """What only a window has: the rate of calls and the share of the window's time."""
    return [Column("calls/s", 8, lambda win, s, t, tot: f"{s.calls / t:.1f}" if t else "n/a"),
            Column("time%", 5, lambda win, s, t, tot: f"{100 * tot[s.path] / tot[()]:.1f}" if tot[()] else "n/a")]


def _own_time() -> Column:
    """The largest part of the stage's own wall time (the wall_split metric): on a CPU, in the run queue, ..."""
    m = METRICS["wall_split"]
    return Column("own time", 12, lambda win, s, t, tot: (ESTIMATE if m.estimated(s) else "") +
                  dominant(m.value(win, s)))


CORE = ("p50", "p99", "cpu_per_wall")                              # after calls/s, before time%
PREFERRED = ("ipc", "page_faults_per_call", "context_switches_per_call")   # the first added as the width allows


def columns(win: Snapshot, width: int) -> List[Column]:
    """calls/s, p50, p99, time%, C/W; then the other metrics the window has while they fit in `width`
    (stage names get at least 18), those of PREFERRED first; the verdict last."""
    rate, share = _window_columns()
    cols = [rate, _metric("p50"), _metric("p99"), share, _metric("cpu_per_wall")]
    if METRICS["wall_split"].wanted(win):
        cols.append(_own_time())
    verdict = _metric("verdict")
    used = 18 + sum(c.width + 1 for c in cols) + verdict.width + 1
    rest = [n for n in PREFERRED if n in METRICS] + [n for n in METRICS if n not in PREFERRED]
    for name in rest:
        if name in CORE or name in ("verdict", "wall_split") or not METRICS[name].wanted(win):
            continue
        c = _metric(name)
        if used + c.width + 1 <= width:
            cols.append(c)
            used += c.width + 1
    return cols + [verdict]


def table_lines(win: Snapshot, secs: float, sort: str = "total", width: int = WIDTH) -> List[str]:
    """The window as text lines of at most `width` characters."""
    cols = columns(win, width)
    name_w = max(10, width - sum(c.width + 1 for c in cols))
    times = held(win)
    times[()] = sum(times[r.path] for r in win.roots)
    lines = [f"{'stage':<{name_w}}" + "".join(f" {c.header:>{c.width}}" for c in cols)]
    for s in ordered(win, sort):
        lines.append(f"{label(s, name_w):<{name_w}}" + "".join(f" {c.text(win, s, secs, times)[:c.width]:>{c.width}}"
                                                             for c in cols))
    if len(lines) == 1:
        lines.append("(no stage completed a call in this window)")
    return [line[:width] for line in lines]


def header(url: str, win: Optional[Snapshot], secs: float, sort: str, width: int, note: str = "") -> List[str]:
    m = win.meta if win is not None else {}
    procs = len(m.get("merged_from") or []) or 1
    who = f"pid {m.get('pid')}" if procs == 1 else f"{procs} processes"
    roots = win.roots if win is not None else []
    calls = sum(s.calls for s in roots)
    errors = sum(s.errors for s in roots)
    first = f"instrument top  {url}  {who}"
    second = (f"window {secs:.1f} s, sort {sort}: top-level {calls / secs if secs else 0:.1f} calls/s, "
              f"{errors} errors" if win is not None else f"sort {sort}: waiting for the first window")
    keys = "keys: t total  c calls  m p50  p p99  u C/W  n name  r tree  q quit"
    out = [first, second + (f"  | {note}" if note else ""), keys]
    return [line[:width] for line in out]


# ---------------------------------------------------------------------- runs
def once(url: str, interval: float, as_json: bool, sort: str = "total", width: int = WIDTH,
         timeout: float = 10.0) -> str:
    """Two snapshots `interval` seconds apart; their window as snapshot JSON or a table."""
    u = snapshot_url(url)
    first = fetch(u, timeout)
    t0 = time.monotonic()
    time.sleep(interval)
    second = fetch(u, timeout)
    measured = time.monotonic() - t0
    try:
        win = with_verdicts(window(second, first))
    except SnapshotError as e:
        raise TopError(f"{u}: no window between the two snapshots: {e}") from None
    if as_json:
        return win.to_json()
    secs = seconds(win, measured)
    return "\n".join(header(u, win, secs, sort, width)[:2] + table_lines(win, secs, sort, width))


class _Keys:
    """Single keys from the terminal (cbreak mode: Ctrl-C still interrupts); nothing when stdin is no terminal."""

    def __init__(self) -> None:
        self.fd = None
        self.saved = None
        try:
            if sys.stdin.isatty():
                import termios
                import tty
                self.fd = sys.stdin.fileno()
                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except Exception:
            self.fd = None

    def wait(self, timeout: float) -> Optional[str]:
        if self.fd is None:
            time.sleep(max(0.0, timeout))
            return None
        r, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        return os.read(self.fd, 1).decode("latin-1") if r else None

    def restore(self) -> None:
        if self.fd is not None and self.saved is not None:
            import termios
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


def live(url: str, interval: float, sort: str = "total", timeout: float = 10.0) -> int:
    """The live view until q or Ctrl-C; the first fetch failing is a TopError (exit 2)."""
    try:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text
    except ImportError:
        raise TopError("the live view needs rich: pip install 'instrument-sdk[top]' (or use --once)") from None
    u = snapshot_url(url)
    last = fetch(u, timeout)
    t_last = time.monotonic()
    console = Console()
    keys = _Keys()
    win: Optional[Snapshot] = None
    secs, note = 0.0, ""

    def frame():
        width = max(40, console.width)
        lines = header(u, win, secs, sort, width, note)
        lines += table_lines(win, secs, sort, width) if win is not None else []
        body = Text("\n".join(lines), no_wrap=True, overflow="crop")
        body.stylize("bold", 0, len(lines[0]))
        if note:
            body.stylize("red", len(lines[0]) + 1, len(lines[0]) + 1 + len(lines[1]))
        return body
    try:
        with Live(frame(), console=console, screen=True, auto_refresh=False, transient=True) as view:
            deadline = time.monotonic() + interval
            while True:
                key = keys.wait(deadline - time.monotonic())
                if key is not None:
                    if key in ("q", "Q"):
                        return 0
                    if key in KEYS:
                        sort = KEYS[key]
                        view.update(frame(), refresh=True)
                    continue
                deadline = time.monotonic() + interval
                try:
                    now = fetch(u, timeout)
                    t_now = time.monotonic()
                    try:
                        win = with_verdicts(window(now, last))
                        secs, note = seconds(win, t_now - t_last), ""
                    except SnapshotError as e:
                        win, note = None, f"new window: {e}"
                    last, t_last = now, t_now
                except TopError as e:
                    note = f"{e}; retrying every {interval:g} s"
                view.update(frame(), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        keys.restore()


def main(url: str, interval: float, sort: str, once_: bool, as_json: bool, width: Optional[int] = None) -> int:
    if as_json or once_:
        w = width or WIDTH
        text = once(url, interval, as_json, sort, w)
        sys.stdout.write(text + "\n")
        return 0
    if not sys.stdout.isatty():
        raise TopError("the live view needs a terminal; use --once (and --json) for scripts")
    return live(url, interval, sort)


__all__ = ["TopError", "snapshot_url", "fetch", "window", "seconds", "table_lines", "once", "live", "main"]
