"""Chrome Trace Event JSON (chrome://tracing, ui.perfetto.dev) from the timeline
events of Snapshots (`configure(trace_events=N)` or `instrument run --trace-events N`).

One `X` event per recorded call, per process and thread, with `tts`/`tdur` from
the thread CPU clock where it was read; `C` counter tracks of the cumulative
calls of each top-level stage; `M` events naming processes and threads.  Calls
that overlap without nesting on one thread (asyncio tasks interleaving) go to an
extra lane of that thread, so every track nests properly.

The slowest calls of each top-level stage (exemplars, `Snapshot.exemplars`) get
their own lane, "slowest calls": the call at its real start and length, and
under it the time of each stage beneath it in that call (a stage's slice holds
its own time and its children's), laid end to end in tree order: a call keeps
how long each stage took, not when.  Items (`instrument.add`) are `C` counter
tracks, one per item name with a series per stage: their totals from the start
of the recording to the snapshot.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..snapshot import Snapshot, path_text
from . import snapshots

NAME = "chrome"
EXTENSION = ".json"

LANE = 10_000_000   # synthetic tid = tid + lane * LANE; Linux tids stay below 2**22
SLOW_TID = 9 * LANE  # the lanes of the slowest calls: SLOW_TID + lane


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


def _call_slices(e: Dict[str, Any], ts_us: float, pid: int, tid: int,
                 order: Dict[Tuple[str, ...], int]) -> List[Dict[str, Any]]:
    """One exemplar as nested X events: each stage's slice is its self time plus its children's, children first."""
    own: Dict[Tuple[str, ...], int] = {}
    for b in e["breakdown"]:
        own[tuple(b["path"])] = own.get(tuple(b["path"]), 0) + b["wall_ns"]
    root = tuple(e["path"])
    incl: Dict[Tuple[str, ...], int] = {}
    for p, ns in own.items():
        for k in range(len(root), len(p) + 1):
            incl[p[:k]] = incl.get(p[:k], 0) + ns
    kids: Dict[Tuple[str, ...], List[Tuple[str, ...]]] = {}
    for p in sorted(incl, key=lambda p: (order.get(p, len(order)), p)):
        if p != root:
            kids.setdefault(p[:-1], []).append(p)
    out = [{"name": root[-1], "cat": "slowest call", "ph": "X", "ts": ts_us, "dur": e["wall_ns"] / 1e3, "pid": pid,
            "tid": tid, "args": {"path": path_text(root), "wall_ms": e["wall_ns"] / 1e6,
                                 "note": "stages beneath are laid end to end: how long each took, not when"}}]

    def lay(p: Tuple[str, ...], start: float) -> None:
        t = start
        for c in kids.get(p, ()):
            dur = incl[c] / 1e3
            out.append({"name": c[-1], "cat": "slowest call", "ph": "X", "ts": t, "dur": dur, "pid": pid, "tid": tid,
                        "args": {"path": path_text(c), "self_ms": own.get(c, 0) / 1e6, "total_ms": incl[c] / 1e6}})
            lay(c, t)
            t += dur
    lay(root, ts_us)
    return out


def trace(snaps: Sequence[Snapshot]) -> Dict[str, Any]:
    """The trace of one or more snapshots (each its own process, on one time axis)."""
    if not any(s.events or any(e["slow"] for e in s.exemplars) for s in snaps):
        raise NoTimeline("the snapshot has no timeline events and no exemplars: record with "
                         "instrument.configure(trace_events=N) or use `instrument run --trace-events N`")
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
        order = {st.path: i for i, st in enumerate(snap)}   # tree order: children as first seen
        slow = sorted((e for e in snap.exemplars if e["slow"]), key=lambda e: (e["start_ns"], -e["wall_ns"]))
        lanes: Dict[int, List[int]] = {}   # pid -> end of each lane's last call
        for e in slow:
            pid = e.get("pid") or pid0
            if pid not in names:
                names[pid] = f"{os.path.basename(argv[0]) if argv and pid == pid0 else 'python'} (pid {pid})"
            start = base + e["start_ns"]
            ends = lanes.setdefault(pid, [])
            k = next((i for i, t in enumerate(ends) if t <= start), len(ends))
            if k == len(ends):
                ends.append(0)
            ends[k] = start + e["wall_ns"]
            threads.setdefault((pid, SLOW_TID + k), f"slowest calls{'' if k == 0 else f' (lane {k})'}")
            out.extend(_call_slices(e, start / 1e3, pid, SLOW_TID + k, order))
        span = m.get("duration_ns")
        if m.get("merged_from") and m.get("start_time") is not None and m.get("end_time") is not None:
            span = int((m["end_time"] - m["start_time"]) * 1e9)
        per_item: Dict[str, Dict[str, Any]] = {}
        for st in snap:
            for name, it in st.items.items():
                per_item.setdefault(name, {})[path_text(st.path)] = it["total"]
        for name, series in per_item.items():
            if pid0 not in names:
                names[pid0] = f"{os.path.basename(argv[0]) if argv else 'python'} (pid {pid0})"
            out.append({"name": f"items: {name}", "ph": "C", "ts": base / 1e3, "pid": pid0,
                        "args": {k: 0 for k in series}})
            out.append({"name": f"items: {name}", "ph": "C", "ts": (base + (span or 0)) / 1e3, "pid": pid0,
                        "args": series})
    meta = [{"name": "process_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": n}} for p, n in names.items()]
    meta += [{"name": "thread_name", "ph": "M", "pid": p, "tid": t, "args": {"name": n}} for (p, t), n in threads.items()]
    meta += [{"name": "thread_sort_index", "ph": "M", "pid": p, "tid": t, "args": {"sort_index": t}}
             for (p, t) in threads]
    out.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    return {"traceEvents": meta + out, "displayTimeUnit": "ms",
            "otherData": {"source": "instrument", "events_dropped": dropped, "start_time": t0}}


def render(snaps: Sequence[Snapshot], indent: Optional[int] = None) -> str:
    """Chrome Trace Event JSON (Perfetto, chrome://tracing) of the timelines.

    Each snapshot stays its own process, all on one time axis.  NoTimeline when
    none has trace events or exemplars."""
    return json.dumps(trace(snapshots(snaps)), indent=indent, allow_nan=False)
