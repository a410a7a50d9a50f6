"""The snapshot file: a Snapshot as a JSON object and back, each field checked on the way in with an error that
names the stage and what was wrong; reading and writing files (atomically).  docs/schema.md describes every field
(tests/test_schema_doc.py holds the two together).

JSON: {"format": "instrument-snapshot", "version": 1, "meta": {...},
       "stages": [...], "events": [...], "exemplars": [...]}
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping   # not typing's: its isinstance() is several times slower, once per field loaded
from typing import Any, Dict, List, Optional, Tuple

from .. import histogram as _hist
from .base import WINDOW_MEMORY, SnapshotError, ci99, counted_nothing, json_number, memory_sums, path_text, uncounted
from .ranks import RANK_FIELDS

FORMAT = "instrument-snapshot"
VERSION = 1
MAX_FILE_BYTES = 1 << 30          # refuse to read snapshot files over 1 GiB
EXEMPLAR_SPLIT = ("on_cpu", "runqueue", "awaiting", "loop_ready")   # an exemplar part's split (blocked: the rest)


def estimate_json(e: Mapping[str, Any], upper: Optional[float] = None) -> Dict[str, Any]:
    """An estimate {"total", "self", "var", "var_self", "reads"} as saved: standard deviations, and the interval."""
    d = {"total": json_number(round(e["total"], 3)), "self": json_number(round(e["self"], 3)), "sd": math.sqrt(e["var"]),
         "sd_self": math.sqrt(e["var_self"]), "reads": e["reads"]}   # unrounded: a reloaded interval is the same
    if e["var"] > 0:   # from the total as saved, as a reloaded snapshot computes it
        d["ci99"] = [round(x, 3) for x in ci99(d["total"], e["var"], upper)]
    return d


def _estimate_from(path: Tuple[str, ...], what: str, raw: Any) -> Optional[Dict[str, Any]]:
    if raw is None:
        return None
    try:
        total = float(raw["total"])
        sd, sd_self = raw.get("sd"), raw.get("sd_self")
        return {"total": total, "self": float(raw["self"]) if "self" in raw else total,
                "var": float(sd) ** 2 if sd else 0.0, "var_self": float(sd_self) ** 2 if sd_self else 0.0,
                "reads": int(raw.get("reads", 0))}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise SnapshotError(f"stage {path_text(path)}: {what} needs a total, got {str(raw)[:80]}") from None


# ------------------------------------------------------------------ stages
def stage_dict(s: Any, percentiles: bool = True) -> Dict[str, Any]:
    """A stage (StageStats) as saved; percentiles=False (a file's or a transfer's form) leaves out what loading
    derives again: the verdict (Snapshot.load judges the stages again), p50..p999 (from `hist`), a counter's
    `estimated` and `running_fraction` (a counter no call counted is `null`: meta.counters says why), and the parts
    of the wall-time split that loading takes as 0 where they are 0."""
    wall = s.wall_ns if percentiles else {"total": s.wall_total, "self": s.wall_self,
                                       "min": s.wall_min, "max": s.wall_max, "mean": s.wall_mean}
    d: Dict[str, Any] = {
        "path": list(s.path), "calls": s.calls, "errors": s.errors,
        "wall_ns": {k: json_number(v) for k, v in wall.items()},
        "cpu_ns": s.cpu_ns,
        "counters": {k: _counter_json(v, derived=percentiles) for k, v in s.counters.items()},
        "hist": {"scheme": _hist.SCHEME, "buckets": [[i, c] for i, c in sorted(s.hist.items())]},
    }
    split = s.wall_split
    if split:
        if "runqueue" in split and s.runqueue is not None:
            split["runqueue"].update({k: v for k, v in estimate_json(s.runqueue, s.covered_run).items()
                                   if k in ("sd", "sd_self", "reads")})
        if not percentiles:
            split = {k: v for k, v in split.items() if k not in ZERO_PARTS or v["total"] or v["self"]}
        d["wall_split_ns"] = split
        d["covered_running_ns"] = {"total": s.covered_run, "self": s.covered_run_self}   # not a part: their sum
    if s.switches:
        d["context_switches"] = {k: estimate_json(v) for k, v in s.switches.items()}
    if s.loop_blockers:
        d["loop_blockers_ns"] = dict(s.loop_blockers)
    if s.loop_blockers_waited:
        d["loop_blockers_waited_ns"] = dict(s.loop_blockers_waited)
    if s.other:
        d["other"] = True
    if s.overlapped_calls:
        d["cpu_ns"]["overlapped_calls"] = s.overlapped_calls
    if s.suspended_total:
        d["suspended_ns"] = {"total": s.suspended_total, "self": s.suspended_self}
    if s.abandoned_calls:
        d["abandoned_calls"] = s.abandoned_calls
    if s.gpu is not None:
        d["gpu"] = dict(s.gpu)
    if s.ops is not None:
        d["ops"] = s.ops
    if s.verdict is not None and percentiles:   # analysis, not a measurement: loading judges the stages again
        d["verdict"] = dict(s.verdict)
    if s.windows is not None:
        d["windows"] = [dict(w, counters=dict(w.get("counters") or {}), items=dict(w.get("items") or {}))
                     for w in s.windows]
    if s.items:
        d["items"] = {k: {"total": json_number(v["total"]), "calls": v["calls"]} for k, v in s.items.items()}
    if s.ranks is not None:
        d["ranks"] = [{"rank": r, **s.ranks[r]} for r in sorted(s.ranks)]
    if s.memory:
        d["memory"] = {src: _memory_json(s, src) for src in s.memory}
    return d


ZERO_PARTS = ("instrument", "awaiting", "loop_ready", "unknown")   # parts loading takes as 0 where a file leaves them out
MEMORY_COUNTS = ("calls", "overlapped", "marked", "fresh", "peak_max")   # saved once, with the figures


def _memory_json(s: Any, src: str) -> Dict[str, Any]:
    """A source's figures (StageStats.memory_of) in bytes, an interval only where it is one (estimated), then the
    sums the means come from; the counts and the figures' peak_max complete them (what a load reads)."""
    f = s.memory_of(src)
    out = {k: json_number(round(v, 1)) if isinstance(v, float) else [round(x, 1) for x in v] if isinstance(v, tuple)
           else v for k, v in f.items() if not (isinstance(v, tuple) and v[0] == v[1])}
    out["sums"] = {k: json_number(v) for k, v in s.memory[src].items() if k not in MEMORY_COUNTS}
    return out


def _memory_from(path: Tuple[str, ...], d: Any) -> Optional[Dict[str, Dict[str, Any]]]:
    if d is None:
        return None
    try:
        return {str(src): memory_sums({**{k: m.get(k) for k in MEMORY_COUNTS}, **m["sums"]}) for src, m in d.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SnapshotError(f"stage {path_text(path)}: memory must be {{source: {{..., sums: {{...}}}}}} as saved, "
                            f"got {str(d)[:200]} ({type(e).__name__}: {e})") from None


def stage_fields(d: Any) -> Dict[str, Any]:
    """The fields of a StageStats from a saved stage, checked."""
    try:
        path = tuple(d["path"])
        if not path or not all(isinstance(p, str) for p in path):
            raise SnapshotError(f"stage path must be a non-empty list of strings, got {d['path']!r}")
        w, c = d["wall_ns"], d.get("cpu_ns") or {}
        h = d.get("hist") or {"scheme": _hist.SCHEME, "buckets": []}
        if h.get("scheme") != _hist.SCHEME:
            raise SnapshotError(f"stage {path_text(path)}: histogram scheme {h.get('scheme')!r} is not "
                             f"{_hist.SCHEME!r}")
        calls = int(d["calls"])
        if calls < 0:
            raise SnapshotError(f"stage {path_text(path)}: calls must be >= 0, got {calls}")
        return dict(path=path, calls=calls, errors=int(d.get("errors", 0)),
                    wall_total=int(w["total"]), wall_self=int(w.get("self", w["total"])),
                    wall_min=None if w.get("min") is None else int(w["min"]),
                    wall_max=None if w.get("max") is None else int(w["max"]),
                    cpu_total=None if c.get("total") is None else int(c["total"]),
                    cpu_self=None if c.get("self") is None else int(c["self"]),
                    cpu_calls=int(c.get("calls", calls if c.get("total") is not None else 0)),
                    cpu_read_calls=int(c["read_calls"]) if c.get("estimated") else None,
                    cpu_sys_total=None if (c.get("sys") or {}).get("total") is None else int(c["sys"]["total"]),
                    cpu_sys_self=None if (c.get("sys") or {}).get("self") is None else int(c["sys"]["self"]),
                    hist=_hist.from_pairs(h.get("buckets", [])),
                    counters={k: _counter_from(v) for k, v in (d.get("counters") or {}).items()},
                    gpu=d.get("gpu"), ops=d.get("ops"), other=bool(d.get("other", False)),
                    verdict=d.get("verdict"), windows=_windows_from(path, d.get("windows")),
                    overlapped_calls=int(c.get("overlapped_calls", 0)),
                    abandoned_calls=int(d.get("abandoned_calls", 0)),
                    suspended_total=int((d.get("suspended_ns") or {}).get("total", 0)),
                    suspended_self=int((d.get("suspended_ns") or {}).get("self", 0)),
                    items=_items_from(path, d.get("items")), **_split_from(path, d, c),
                    ranks=_ranks_from(path, d.get("ranks")), memory=_memory_from(path, d.get("memory")))
    except SnapshotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SnapshotError(f"malformed stage entry {str(dict(d))[:200] if isinstance(d, Mapping) else d!r}: "
                             f"{type(e).__name__}: {e}") from None


COUNTER_DERIVED = ("estimated", "running_fraction")   # what loading derives from a counter's other figures


def _counter_json(c: Mapping[str, Any], derived: bool = True) -> Optional[Dict[str, Any]]:
    """A counter's dict as saved: its variances as standard deviations, and its interval where estimated;
    derived=False leaves out COUNTER_DERIVED, and gives a counter no call counted as None."""
    if not derived and counted_nothing(c):
        return None
    d = {k: v for k, v in c.items() if k not in ("var", "var_self") and (derived or k not in COUNTER_DERIVED)}
    if c.get("var") and c.get("total") is not None:
        d.update(sd=math.sqrt(c["var"]), sd_self=math.sqrt(c.get("var_self") or 0),
                 ci99=[round(x, 3) for x in ci99(c["total"], c["var"])])
    return d


def _counter_from(raw: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if raw is None:   # no call counted it
        return uncounted()
    d = dict(raw)
    sd, sd_self = d.pop("sd", None), d.pop("sd_self", None)
    d.pop("ci99", None)
    if "estimated" not in d and "read_calls" in d and "counted_calls" in d and d.get("total") is not None:
        d["estimated"] = d["read_calls"] != d["counted_calls"]
    if "running_fraction" not in d and "enabled_ns" in d and "running_ns" in d:
        d["running_fraction"] = d["running_ns"] / d["enabled_ns"] if d["enabled_ns"] else None
    if sd:
        d.update(var=float(sd) ** 2, var_self=float(sd_self or 0) ** 2)
    return d


_NONE: Mapping[str, Any] = {}   # read only: what an absent object reads as


def _split_from(path: Tuple[str, ...], d: Mapping[str, Any], c: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields of the wall-time split, the helpers and the context switches, from a saved stage."""
    split = d.get("wall_split_ns") or _NONE
    if not isinstance(split, Mapping):
        raise SnapshotError(f"stage {path_text(path)}: wall_split_ns must be an object")
    rq, loop, sdk, cov = split.get("runqueue"), split.get("loop_ready") or _NONE, split.get("instrument") or _NONE, \
        d.get("covered_running_ns") or split.get("covered_running") or _NONE   # older files: inside the split
    switches = d.get("context_switches") or _NONE
    sd = float(c.get("sd") or 0), float(c.get("sd_self") or 0)
    gil = split.get("gil")
    held, waited = d.get("loop_blockers_ns"), d.get("loop_blockers_waited_ns")
    if gil is not None and not (isinstance(gil, Mapping) and isinstance(gil.get("total"), (int, float))
                                and isinstance(gil.get("self"), (int, float))
                                and isinstance(gil.get("samples", {}), Mapping)):
        raise SnapshotError(f"stage {path_text(path)}: wall_split_ns.gil needs a total and a self (numbers) and "
                            f"samples (an object), got {str(gil)[:80]}")
    return {"runqueue": _estimate_from(path, "wall_split_ns.runqueue", rq),
            "helpers": _estimate_from(path, "cpu_ns.helpers", c.get("helpers")),
            "switches": {k: _estimate_from(path, f"context_switches.{k}", v) for k, v in switches.items()},
            "loop_total": int(loop.get("total", 0)), "loop_self": int(loop.get("self", 0)),
            "instrument_total": int(sdk.get("total", 0)), "instrument_self": int(sdk.get("self", 0)),
            "covered_run": int(cov.get("total", 0)), "covered_run_self": int(cov.get("self", 0)),
            "cpu_var": sd[0] ** 2, "cpu_var_self": sd[1] ** 2,
            "gil_total": None if gil is None else int(gil["total"]), "gil_self": None if gil is None else int(gil["self"]),
            "gil_samples": None if gil is None else {str(k): float(v) for k, v in (gil.get("samples") or {}).items()},
            "loop_blockers": {str(k): int(v) for k, v in held.items()} if held else {},
            "loop_blockers_waited": {str(k): int(v) for k, v in waited.items()} if waited else {}}


def _windows_from(path: Tuple[str, ...], raw: Any) -> Optional[Tuple[Dict[str, Any], ...]]:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(w, Mapping) for w in raw):
        raise SnapshotError(f"stage {path_text(path)}: windows must be a list of objects, got {str(raw)[:80]}")
    out = []
    for w in raw:
        calls, wall = w.get("calls"), w.get("wall_ns")
        if not isinstance(calls, int) or isinstance(calls, bool) or calls < 0 or not isinstance(wall, (int, float)):
            raise SnapshotError(f"stage {path_text(path)}: a window needs calls (an integer >= 0) and wall_ns "
                             f"(a number), got {str(dict(w))[:80]}")
        counters, items = w.get("counters") or {}, w.get("items") or {}
        if not isinstance(counters, Mapping) or not isinstance(items, Mapping):
            raise SnapshotError(f"stage {path_text(path)}: window counters and items must be objects")
        try:
            memory = {str(src): {k: float(m[k]) for k in WINDOW_MEMORY} for src, m in (w.get("memory") or {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise SnapshotError(f"stage {path_text(path)}: a window's memory must be {{source: {{"
                                f"{', '.join(WINDOW_MEMORY)}}}}}, got {str(w.get('memory'))[:80]}") from None
        out.append({"calls": calls, "wall_ns": wall, "p50_ns": w.get("p50_ns"), "cpu_ns": w.get("cpu_ns"),
                    "counters": dict(counters), "items": dict(items), "memory": memory,
                    "start_time": w.get("start_time"), "end_time": w.get("end_time")})
    return tuple(out)


def _items_from(path: Tuple[str, ...], raw: Any) -> Dict[str, Dict[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SnapshotError(f"stage {path_text(path)}: items must be an object {{name: {{total, calls}}}}")
    out = {}
    for k, v in raw.items():
        total, calls = (v.get("total"), v.get("calls")) if isinstance(v, Mapping) else (None, None)
        if (not isinstance(total, (int, float)) or isinstance(total, bool) or not isinstance(calls, int)
                or total < 0 or calls < 0):
            raise SnapshotError(f"stage {path_text(path)}: item {k!r} needs a total >= 0 and calls >= 0, got {v!r}")
        out[str(k)] = {"total": total, "calls": calls}
    return out


def _ranks_from(path: Tuple[str, ...], raw: Any) -> Optional[Dict[int, Dict[str, Any]]]:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(x, Mapping) for x in raw):
        raise SnapshotError(f"stage {path_text(path)}: ranks must be a list of objects, got {str(raw)[:80]}")
    out: Dict[int, Dict[str, Any]] = {}
    for x in raw:
        counts = [x.get(k) for k in ("rank", "calls", "errors")]
        numbers = [x.get(k) for k in RANK_FIELDS[2:]]
        if (not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts) or counts[0] in out
                or x.get("wall_ns") is None or x.get("self_ns") is None
                or not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)
                        for v in numbers)):
            raise SnapshotError(f"stage {path_text(path)}: a ranks entry needs a rank (once), calls and errors "
                             f"(integers >= 0), wall_ns and self_ns >= 0, cpu_ns and gpu_ns >= 0 or null; got "
                             f"{str(dict(x))[:80]}")
        r = counts[0]
        out[r] = {k: x.get(k) for k in RANK_FIELDS}
    return out


# ------------------------------------------------------------------ exemplars
# One dict per kept call of a root stage: {"path": [root], "wall_ns", "start_ns" (since the start of recording),
# "pid", "tid", "seq" (the call's number in its process), "slow" (among the K slowest), "sample" (in the uniform
# sample of typical calls), "breakdown": [{"path", "wall_ns", "split", "mem_peak_bytes"}, ...] (self time of each
# stage in that call, how it went, its memory peak).
def _exemplar_from(d: Any) -> Dict[str, Any]:
    try:
        path = d["path"]
        if not isinstance(path, list) or len(path) != 1 or not isinstance(path[0], str):
            raise SnapshotError(f"exemplar path must be a one-name list (a root stage), got {path!r}")
        parts = []
        for b in d.get("breakdown") or []:
            bp = b["path"]
            if not isinstance(bp, list) or not bp or not all(isinstance(x, str) for x in bp):
                raise SnapshotError(f"exemplar breakdown path must be a list of names, got {bp!r}")
            part = {"path": list(bp), "wall_ns": int(b["wall_ns"])}
            split = b.get("split")
            if isinstance(split, Mapping):   # how that stage's self time went in the call (None: not read)
                part["split"] = {k: None if split.get(k) is None else int(split[k]) for k in EXEMPLAR_SPLIT}
                if split.get("gil") is not None:   # where the GIL sampler's counts were read in the call
                    part["split"]["gil"] = int(split["gil"])
            if b.get("mem_peak_bytes") is not None:   # the resident set's peak, where measured in the call
                part["mem_peak_bytes"] = int(b["mem_peak_bytes"])
            parts.append(part)
        out = {"path": list(path), "wall_ns": int(d["wall_ns"]), "start_ns": int(d.get("start_ns") or 0),
               "pid": d.get("pid"), "tid": d.get("tid"), "seq": d.get("seq"), "slow": bool(d.get("slow")),
               "sample": bool(d.get("sample")), "breakdown": parts}
        if out["wall_ns"] < 0:
            raise SnapshotError(f"exemplar wall_ns must be >= 0, got {out['wall_ns']}")
        return out
    except SnapshotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SnapshotError(f"malformed exemplar {str(d)[:200]}: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------- snapshots
def snapshot_dict(snap: Any, percentiles: bool = True) -> Dict[str, Any]:
    """A Snapshot as saved (stages by stage_dict)."""
    out = {"format": FORMAT, "version": VERSION, "meta": snap.meta,
           "stages": [stage_dict(s, percentiles) for s in snap.stages]}
    if snap.events:
        out["events"] = [dict(e) for e in snap.events]
    if snap.exemplars:
        out["exemplars"] = [dict(e, path=list(e["path"]), breakdown=[dict(b) for b in e["breakdown"]])
                         for e in snap.exemplars]
    return out


def snapshot_parts(d: Any) -> Tuple[List[Any], Mapping[str, Any], List[Any], List[Dict[str, Any]]]:
    """A saved snapshot's stages (each for stage_fields), meta, events and exemplars, checked."""
    if not isinstance(d, Mapping):
        raise SnapshotError(f"a snapshot is a JSON object, got {type(d).__name__}")
    if d.get("format") != FORMAT:
        raise SnapshotError(f"not an instrument snapshot: format is {d.get('format')!r}, expected {FORMAT!r}")
    v = d.get("version")
    if not isinstance(v, int) or isinstance(v, bool):
        raise SnapshotError(f"snapshot version must be an integer, got {v!r}")
    if v > VERSION:
        raise SnapshotError(f"snapshot version {v} is newer than this instrument reads (version {VERSION}); "
                         "upgrade instrument")
    if v < 1:
        raise SnapshotError(f"snapshot version {v} is not valid (versions start at 1)")
    stages = d.get("stages")
    if not isinstance(stages, list):
        raise SnapshotError("snapshot has no 'stages' list")
    meta = d.get("meta") or {}
    if not isinstance(meta, Mapping):
        raise SnapshotError("snapshot 'meta' must be an object")
    events = d.get("events") or []
    if not isinstance(events, list):
        raise SnapshotError("snapshot 'events' must be a list")
    exemplars = d.get("exemplars") or []
    if not isinstance(exemplars, list):
        raise SnapshotError("snapshot 'exemplars' must be a list")
    return stages, meta, events, [_exemplar_from(e) for e in exemplars]


def read_file(path: str) -> Any:
    """A snapshot file's JSON, read with the file's size and encoding checked."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror or e}") from None
    if size > MAX_FILE_BYTES:
        raise SnapshotError(f"{path}: {size} bytes is over the {MAX_FILE_BYTES} byte limit for snapshot files")
    if size == 0:
        raise SnapshotError(f"{path}: file is empty")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SnapshotError(f"{path}: not a snapshot: the file is not UTF-8 text (binary?)") from None
    except json.JSONDecodeError as e:
        raise SnapshotError(f"{path}: not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}") from None
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror or e}") from None
    except RecursionError:
        raise SnapshotError(f"{path}: JSON nested too deeply") from None


def atomic_write(path: str, data: bytes) -> str:
    """Write `data` to a temporary file beside `path`, fsync, rename: on failure
    the previous file at `path` is left as it was and no temporary remains."""
    fd, tmp = tempfile.mkstemp(prefix=".instrument-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)    # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path

