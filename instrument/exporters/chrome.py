"""Chrome Trace Event JSON (chrome://tracing, ui.perfetto.dev) from the timeline
events of Snapshots (`configure(trace_events=N)` or `instrument run --trace-events N`).

One `X` event per recorded call, per process and thread, with `tts`/`tdur` from
the thread CPU clock where it was read; `C` counter tracks of the cumulative
calls of each top-level stage; `M` events naming processes and threads.  Calls
that overlap without nesting on one thread (asyncio tasks interleaving) go to an
extra lane of that thread, so every track nests properly.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from ..snapshot import Snapshot, path_text

LANE = 10_000_000   # synthetic tid = tid + lane * LANE; Linux tids stay below 2**22


class NoTimeline(ValueError):
    """The snapshot was recorded without trace events."""


def _lanes(evs: List[Dict[str, Any]]) -> List[int]:
    """Lane of each event (sorted by start, longest first) so that each lane nests;
    an event goes to the lane where its parent stage is open when there is one."""
    stacks: List[List[Tuple[int, Tuple[str, ...]]]] = []
    out = []
    for e in evs:
        start, end, path = e["ts_ns"], e["ts_ns"] + e["dur_ns"], tuple(e["path"])
        fits = []
        for k, st in enumerate(stacks):
            while st and st[-1][0] <= start:
                st.pop()
            if not st or end <= st[-1][0]:
                fits.append(k)
        parent = [k for k in fits if stacks[k] and stacks[k][-1][1] == path[:-1]]
        if parent or fits:
            k = (parent or fits)[0]
        else:
            k = len(stacks)
            stacks.append([])
        stacks[k].append((end, path))
        out.append(k)
    return out


def trace(*snaps: Snapshot) -> Dict[str, Any]:
    """The trace of one or more snapshots (each its own process, on one time axis)."""
    if not any(s.events for s in snaps):
        raise NoTimeline("the snapshot has no timeline events: record with instrument.configure(trace_events=N) "
                         "or use `instrument run --trace-events N`")
    metas = [s.meta for s in snaps]
    starts = [m["start_time"] for m in metas if isinstance(m.get("start_time"), (int, float))]
    t0 = min(starts) if starts else 0.0
    out: List[Dict[str, Any]] = []
    names: Dict[int, str] = {}
    threads: Dict[Tuple[int, int], str] = {}
    dropped = 0
    for snap, m in zip(snaps, metas):
        base = int(round(((m.get("start_time") or t0) - t0) * 1e9))
        dropped += m.get("events_dropped") or 0
        pid0 = m.get("pid") or 0
        argv = m.get("argv") or []
        by_thread: Dict[Tuple[int, int], List[Dict[str, Any]]] = {}
        for e in snap.events:
            pid = e.get("pid", pid0)
            by_thread.setdefault((pid, e["tid"]), []).append(e)
            if pid not in names:
                prog = os.path.basename(argv[0]) if argv and pid == pid0 else "python"
                names[pid] = f"{prog} (pid {pid})"
        calls: Dict[int, Dict[str, int]] = {}
        roots: List[Tuple[int, int, str]] = []
        for (pid, tid), evs in by_thread.items():
            evs.sort(key=lambda e: (e["ts_ns"], -e["dur_ns"], len(e["path"])))
            for e, lane in zip(evs, _lanes(evs)):
                t = tid + lane * LANE
                threads.setdefault((pid, t), f"thread {tid}" + (f" (overlapping calls, lane {lane})" if lane else ""))
                x = {"name": e["path"][-1], "cat": "stage", "ph": "X", "ts": (base + e["ts_ns"]) / 1e3,
                     "dur": e["dur_ns"] / 1e3, "pid": pid, "tid": t, "args": {"path": path_text(e["path"])}}
                if e.get("tts_ns") is not None and e.get("tdur_ns") is not None:
                    x["tts"], x["tdur"] = e["tts_ns"] / 1e3, e["tdur_ns"] / 1e3
                out.append(x)
                end = base + e["ts_ns"] + e["dur_ns"]
                if len(e["path"]) == 1:
                    roots.append((end, pid, e["path"][0]))
                if isinstance(e.get("counters"), dict):
                    out.append({"name": f"{e['path'][-1]} counters", "ph": "C", "ts": end / 1e3, "pid": pid,
                                "args": {k: v for k, v in e["counters"].items() if isinstance(v, (int, float))}})
        for end, pid, name in sorted(roots):
            c = calls.setdefault(pid, {})
            c[name] = c.get(name, 0) + 1
            out.append({"name": "calls", "ph": "C", "ts": end / 1e3, "pid": pid, "args": dict(c)})
    meta = [{"name": "process_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": n}} for p, n in names.items()]
    meta += [{"name": "thread_name", "ph": "M", "pid": p, "tid": t, "args": {"name": n}} for (p, t), n in threads.items()]
    meta += [{"name": "thread_sort_index", "ph": "M", "pid": p, "tid": t, "args": {"sort_index": t}}
             for (p, t) in threads]
    out.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    return {"traceEvents": meta + out, "displayTimeUnit": "ms",
            "otherData": {"source": "instrument", "events_dropped": dropped, "start_time": t0}}


def render(*snaps: Snapshot, indent: Optional[int] = None) -> str:
    """The Chrome Trace Event JSON of the snapshots' timelines (NoTimeline when they have none)."""
    return json.dumps(trace(*snaps), indent=indent, allow_nan=False)


def write(path: str, *snaps: Snapshot, indent: Optional[int] = None) -> None:
    data = render(*snaps, indent=indent)
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)
