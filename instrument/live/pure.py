"""The hot path in pure Python: the same interface as the C extension
(`instrument._native`), chosen by instrument.live.backend when the extension is
missing or the configuration asks for it.  Slower, identical in what it records.
"""
from __future__ import annotations

import contextvars
import sys
import threading
import time
import weakref
from typing import Any, Dict, List, Optional

from .. import histogram as _hist
from . import callsite

MAX_NAME_LEN = 1024
HIST_SUB_BITS = _hist.SUB_BITS
HIST_BLOCKS = _hist.BLOCKS
OTHER_NAME = "(other)"

_perf_ns = time.perf_counter_ns
_thread_ns = time.thread_time_ns
now_ns = time.monotonic_ns
hist_index = _hist.index

_enabled = True
_cpu_clock = True
_max_nodes = 10000
_epoch = 1
_hook_enter = None
_hook_exit = None
_nvtx = None          # instrument.nvtx module while NVTX emission is on
_loop = None          # asyncio.events._get_running_loop once asyncio is imported
_ctr_events: list = []          # [(type, config)] every thread opens
_ctr_excl = False
_ctr_taskclock = -1
_ctr_gen = 1
_ctr_first: Optional[dict] = None   # what the first thread's open gave: errno per event, exclude_kernel

_lock = threading.RLock()         # guards node creation, thread registry, folding; never taken per stage
_warned: set = set()
_counts = {"unmatched_exits": 0, "out_of_order_exits": 0, "cross_thread_exits": 0, "internal_failures": 0,
           "folded_calls": 0}

# nodes: id -> (parent, name, other); (parent, name) -> id.  Node 0 is the root.
_nodes: List[tuple] = [(-1, None, 0)]
_node_ids: Dict[tuple, int] = {}
_named = 0
_open = 0      # frames open anywhere: the node table can only be rebuilt at 0
_node_gen = 1  # bumped when the node table is rebuilt: frames of older generations name no node

_ring: List[Optional[tuple]] = []
_ring_next = 0
_ring_total = 0


def _warn_once(key: str, msg: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    callsite.warn(msg)


def _internal_failure(what: str) -> None:
    _counts["internal_failures"] += 1
    _warn_once(what, f"instrument: internal failure in {what}; measurement goes on without it")


def _check_name(name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(f"stage name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("stage name must not be empty")
    if len(name) > MAX_NAME_LEN:
        raise ValueError(f"stage name is {len(name)} characters long; at most {MAX_NAME_LEN} are allowed")


def _node_child(parent: int, name: str) -> int:
    global _named
    nid = _node_ids.get((parent, name))
    if nid is not None:
        return nid
    with _lock:
        nid = _node_ids.get((parent, name))
        if nid is not None:
            return nid
        if _named < _max_nodes:
            _named += 1
            nid = len(_nodes)
            _nodes.append((parent, name, 0))
            _node_ids[(parent, name)] = nid
            return nid
        _counts["folded_calls"] += 1
        if _nodes[parent][2]:
            return parent
        nid = _node_ids.get((parent, OTHER_NAME))
        if nid is None:
            nid = len(_nodes)
            _nodes.append((parent, OTHER_NAME, 1))
            _node_ids[(parent, OTHER_NAME)] = nid
            _warn_once("cardinality", f"instrument: more than {_max_nodes} distinct stages; new ones are folded into "
                       f"'{OTHER_NAME}' (configure(max_stages=...) raises the cap)")
        return nid


# ----------------------------------------------------------- per-thread slots
# slot: [calls, errors, cpu_calls, wall_total, wall_self, wall_min, wall_max, cpu_total, cpu_self, hist, counters]
# counters: None or a list per event of [total, self, enabled, running, counted, scaled]
def _new_slot() -> list:
    return [0, 0, 0, 0, 0, sys.maxsize, 0, 0, 0, {}, None]


def _merge_slot(d: list, s: list) -> None:
    for k in (0, 1, 2, 3, 4, 7, 8):
        d[k] += s[k]
    d[5] = min(d[5], s[5])
    d[6] = max(d[6], s[6])
    h = d[9]
    for i, c in s[9].items():
        h[i] = h.get(i, 0) + c
    if s[10] is not None:
        if d[10] is None:
            d[10] = [[0.0, 0.0, 0, 0, 0, 0] for _ in s[10]]
        for dc, sc in zip(d[10], s[10]):
            for k in range(6):
                dc[k] += sc[k]


_retired: Dict[int, list] = {}
_threads: "weakref.WeakValueDictionary[int, _ThreadSlots]" = weakref.WeakValueDictionary()  # live threads' slots


class _ThreadSlots:
    """One thread's slots; folded into the retired slots when the thread ends."""
    __slots__ = ("stats", "native_id", "perf", "perf_gen", "__weakref__")

    def __init__(self) -> None:
        self.stats: Dict[int, list] = {}
        self.perf = None
        self.perf_gen = 0
        self.native_id = threading.get_native_id()
        with _lock:
            _threads[id(self)] = self

    def __del__(self) -> None:
        try:
            if self.perf is not None:
                self.perf.close()
            with _lock:
                _threads.pop(id(self), None)
                for nid, s in self.stats.items():
                    d = _retired.get(nid)
                    if d is None:
                        _retired[nid] = s
                    else:
                        _merge_slot(d, s)
        except Exception:
            pass


_local = threading.local()


def _slots() -> _ThreadSlots:
    try:
        return _local.slots
    except AttributeError:
        _local.slots = s = _ThreadSlots()
        return s


# ----------------------------------------------------------------- the stack
class _Frame:
    __slots__ = ("stage", "node", "parent", "slots", "epoch", "t0", "cpu0", "child_wall", "child_cpu", "hook",
                 "nvtx", "nvtx_id", "c0", "child_c", "gen", "cpu_src", "open")

    def __del__(self) -> None:
        # a frame whose context died before it exited (an abandoned task) no longer holds the node table,
        # as the C backend's stack does when it is freed
        global _open
        try:
            if self.open:
                _open -= 1
        except AttributeError:
            pass


def _counters(slots: "_ThreadSlots"):
    """The thread's counter group, opened on its first stage (or after the events changed)."""
    global _ctr_first
    if slots.perf_gen != _ctr_gen:
        if slots.perf is not None:
            slots.perf.close()
        from .perf_ctypes import CounterGroup
        slots.perf = CounterGroup(_ctr_events, exclude_kernel=_ctr_excl)
        slots.perf_gen = _ctr_gen
        if _ctr_first is None:
            _ctr_first = {"errno": list(slots.perf.status), "exclude_kernel": bool(slots.perf.exclude_kernel)}
    return slots.perf


def _in_event_loop() -> bool:
    global _loop
    if _loop is None:
        ev = sys.modules.get("asyncio.events")
        if ev is None:
            return False
        _loop = ev._get_running_loop
    return _loop() is not None


_stack: contextvars.ContextVar = contextvars.ContextVar("instrument_stack", default=None)


def _enter(stage: "Stage") -> None:
    if not _enabled:
        return
    try:
        parent = _stack.get()
        f = _Frame()
        f.stage = stage
        f.parent = parent
        f.node = _node_child(parent.node if parent is not None and parent.gen == _node_gen else 0, stage.name)
        f.gen = _node_gen
        f.slots = _slots()
        f.epoch = _epoch
        f.child_wall = f.child_cpu = 0
        f.hook = None
        f.nvtx, f.c0, f.cpu0, f.cpu_src, f.t0 = 0, None, -1, 0, _perf_ns()
        _stack.set(f)   # before the hook, as in the C backend: current_path() includes this stage
        global _open
        _open += 1
        f.open = True
        if _hook_enter is not None:
            try:
                f.hook = _hook_enter(stage.name)
            except Exception:
                _internal_failure("integration enter hook")
        if _nvtx is not None:
            if _in_event_loop():
                f.nvtx, f.nvtx_id = 2, _nvtx.start(stage.name, stage.color, stage.category)
            else:
                f.nvtx = 1
                _nvtx.push(stage.name, stage.color, stage.category)
        if _ctr_events:
            f.c0 = (_ctr_gen, _counters(f.slots).read())
            f.child_c = [0.0] * len(_ctr_events)
            if _ctr_taskclock >= 0 and f.c0[1][_ctr_taskclock][2]:
                f.cpu0, f.cpu_src = f.c0[1][_ctr_taskclock][0], 2
        if f.cpu_src == 0 and _cpu_clock:
            f.cpu0, f.cpu_src = _thread_ns(), 1
        f.t0 = _perf_ns()
    except Exception:
        _internal_failure("stage enter")


def _exit(stage: "Stage", error: bool) -> None:
    global _ring_next, _ring_total
    t1 = _perf_ns()
    top = _stack.get()
    f, above = top, None
    while f is not None and f.stage is not stage:
        above, f = f, f.parent
    if f is None:
        if _enabled:
            _counts["unmatched_exits"] += 1
            _warn_once("unmatched", f"instrument: stage {stage.name!r} exited on a different thread or task than it was "
                       "entered on (or exited twice); that call is not recorded")
        return
    global _open
    _open -= 1
    f.open = False
    try:
        slots = _slots()
        cvals = None
        cpu = -1
        if f.c0 is not None and f.c0[0] == _ctr_gen and f.slots is slots and slots.perf_gen == _ctr_gen:
            c1 = slots.perf.read()
            cvals = []
            for (v0, e0, r0), (v1, e1, r1) in zip(f.c0[1], c1):
                de, dr = e1 - e0, r1 - r0
                # multiplexed: scale by enabled/running; never ran: no value (not 0)
                cvals.append((None if dr == 0 else float(v1 - v0) if dr == de else (v1 - v0) * (de / dr), de, dr))
            if f.cpu_src == 2 and c1[_ctr_taskclock][2]:
                cpu = c1[_ctr_taskclock][0] - f.cpu0
        if f.cpu_src == 1 and f.slots is slots:   # CPU time only from the clock cpu0 came from
            cpu = _thread_ns() - f.cpu0
        if above is None:
            _stack.set(f.parent)
        else:
            _counts["out_of_order_exits"] += 1
            _warn_once("order", f"instrument: stage {stage.name!r} exited while an inner stage was still open; both "
                       "are kept and recorded as they close")
            above.parent = f.parent
        if f.slots is not slots:
            _counts["cross_thread_exits"] += 1
            _warn_once("thread", f"instrument: stage {stage.name!r} was exited on another thread than it was entered "
                       "on; its CPU time is not recorded for that call")
        wall = t1 - f.t0
        p = f.parent
        if p is not None:
            p.child_wall += wall
            if cpu >= 0:
                p.child_cpu += cpu
            if cvals is not None and p.c0 is not None and p.c0[0] == f.c0[0]:
                for k, (v, _, _) in enumerate(cvals):
                    if v is not None:
                        p.child_c[k] += v
        if f.epoch == _epoch:
            s = slots.stats.get(f.node)
            if s is None:
                s = slots.stats[f.node] = _new_slot()
            s[0] += 1
            if error:
                s[1] += 1
            s[3] += wall
            s[4] += max(wall - f.child_wall, 0)
            if wall < s[5]:
                s[5] = wall
            if wall > s[6]:
                s[6] = wall
            if cpu >= 0:
                s[2] += 1
                s[7] += cpu
                s[8] += max(cpu - f.child_cpu, 0)
            i = _hist.index(wall)
            h = s[9]
            h[i] = h.get(i, 0) + 1
            if cvals is not None:
                if s[10] is None:
                    s[10] = [[0.0, 0.0, 0, 0, 0, 0] for _ in cvals]
                for k, (v, de, dr) in enumerate(cvals):
                    if v is None:
                        continue
                    c = s[10][k]
                    c[0] += v
                    c[1] += max(v - f.child_c[k], 0.0)
                    c[2] += de
                    c[3] += dr
                    c[4] += 1
                    c[5] += dr != de
            if _ring:
                _ring[_ring_next] = (f.node, slots.native_id, f.t0, wall, f.cpu0 if cpu >= 0 else -1, cpu)
                _ring_next = (_ring_next + 1) % len(_ring)
                _ring_total += 1
        if f.hook is not None and _hook_exit is not None:
            try:
                _hook_exit(f.hook)
            except Exception:
                _internal_failure("integration exit hook")
        if f.nvtx == 2:
            _nvtx.end(f.nvtx_id)
        elif f.nvtx == 1 and f.slots is slots:
            _nvtx.pop()
    except Exception:
        _internal_failure("stage exit")


class Stage:
    """A named stage: `with stage:` times the block and nests it under the enclosing stage."""
    __slots__ = ("_name", "color", "category", "__weakref__")

    def __init__(self, name: str, color: Optional[int] = None, *, category: int = 0) -> None:
        _check_name(name)
        self._name = sys.intern(name)
        if color is None:
            from .nvtx import color_for
            color = color_for(name)
        elif isinstance(color, bool) or not isinstance(color, int) or not 0 <= color <= 0xFFFFFFFF:
            raise ValueError(f"color must be an int 0xRRGGBB or 0xAARRGGBB, got {color!r}")
        elif color <= 0xFFFFFF:
            color |= 0xFF000000
        self.color = color
        self.category = int(category)

    @property
    def name(self) -> str:
        return self._name

    def __enter__(self) -> "Stage":
        _enter(self)
        return self

    def __exit__(self, et, ev, tb) -> bool:
        _exit(self, et is not None)
        return False

    def __repr__(self) -> str:
        return f"instrument.stage({self._name!r})"


_cache: Dict[str, Stage] = {}


def stage(name: str) -> Stage:
    s = _cache.get(name) if isinstance(name, str) else None
    if s is None:
        s = Stage(name)
        if len(_cache) < 100000:
            _cache[s.name] = s
    return s


class Region:
    """Region(stage, func): func called inside stage."""

    def __init__(self, stage: Stage, func) -> None:
        if not isinstance(stage, Stage):
            raise TypeError(f"Region needs a Stage, not {type(stage).__name__}")
        if not callable(func):
            raise TypeError(f"region() needs a callable, not {type(func).__name__}")
        self.stage = stage
        self.__wrapped__ = func

    def __call__(self, *args, **kwargs):
        st = self.stage
        _enter(st)
        try:
            r = self.__wrapped__(*args, **kwargs)
        except BaseException:
            _exit(st, True)
            raise
        _exit(st, False)
        return r

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        import types
        return types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<instrument.region {self.stage.name!r} of {self.__wrapped__!r}>"


def configure(*, enabled=None, cpu_clock=None, max_stages=None, trace_events=None, nvtx=None) -> None:
    global _enabled, _cpu_clock, _max_nodes, _ring, _ring_next, _ring_total, _nvtx
    if nvtx is not None:
        from . import nvtx as nvtx_module
        _nvtx = nvtx_module if nvtx and nvtx_module.backend() != "none" else None
    if max_stages is not None and max_stages < 1:
        raise ValueError(f"max_stages must be at least 1, got {max_stages}")
    if trace_events is not None and trace_events < 0:
        raise ValueError(f"trace_events must be 0 or more, got {trace_events}")
    if enabled is not None:
        _enabled = bool(enabled)
    if cpu_clock is not None:
        _cpu_clock = bool(cpu_clock)
    if max_stages is not None:
        _max_nodes = int(max_stages)
    if trace_events is not None and trace_events != len(_ring):
        _ring = [None] * int(trace_events)
        _ring_next = _ring_total = 0


def set_counters(events, exclude_kernel, taskclock_index) -> None:
    global _ctr_events, _ctr_excl, _ctr_taskclock, _ctr_gen, _ctr_first
    events = [(int(t), int(c)) for t, c in events]
    if len(events) > 16:
        raise ValueError(f"at most 16 counters can be read per stage, got {len(events)}")
    with _lock:
        for src in [_retired] + [t.stats for t in _threads.values()]:
            for slot in src.values():
                slot[10] = None      # counter slots of the old events would be misread under the new ones
    _ctr_events, _ctr_excl = events, bool(exclude_kernel)
    _ctr_taskclock = taskclock_index if taskclock_index < len(events) else -1
    _ctr_gen += 1
    _ctr_first = None


def set_hooks(enter, exit) -> None:
    global _hook_enter, _hook_exit
    if (enter is None) != (exit is None):
        raise ValueError("set_hooks needs both hooks or neither")
    _hook_enter, _hook_exit = enter, exit


def collect() -> Dict[str, Any]:
    with _lock:
        merged: Dict[int, list] = {}
        sources = [_retired] + [t.stats for t in list(_threads.values())]
        for src in sources:
            for nid, s in list(src.items()):
                d = merged.get(nid)
                if d is None:
                    d = merged[nid] = _new_slot()
                _merge_slot(d, [s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], dict(s[9]),
                                None if s[10] is None else [list(c) for c in s[10]]])
        nodes = [(i, p, n, o) for i, (p, n, o) in enumerate(_nodes) if i > 0]
        threads = len(_threads)
    stats = [{"node": nid, "calls": s[0], "errors": s[1], "wall_total": s[3], "wall_self": s[4], "wall_min": s[5],
              "wall_max": s[6], "cpu_calls": s[2], "cpu_total": s[7], "cpu_self": s[8], "hist": sorted(s[9].items()),
              "counters": [tuple(c) for c in s[10]] if s[10] is not None else []}
             for nid, s in sorted(merged.items()) if s[0]]
    n = min(_ring_total, len(_ring))
    start = 0 if _ring_total < len(_ring) else _ring_next
    events = [_ring[(start + k) % len(_ring)] for k in range(n)]
    res = dict(counter_errno=[None] * len(_ctr_events) if _ctr_first is None else list(_ctr_first["errno"]))
    if _ctr_first is not None:
        res["counter_open"] = {"exclude_kernel": _ctr_first["exclude_kernel"], "rdpmc": False}
    return dict(res, nodes=nodes, stats=stats, events=events, events_dropped=_ring_total - n, max_stages=_max_nodes,
                threads=threads, clock_ns=_perf_ns(), **_counts)


def _zero() -> None:
    global _ring_next, _ring_total
    with _lock:
        for t in list(_threads.values()):
            t.stats.clear()
        _retired.clear()
        for k in _counts:
            _counts[k] = 0
        _ring_next = _ring_total = 0


def reset() -> None:
    global _named, _node_gen
    _zero()
    with _lock:
        if _open == 0:
            _node_gen += 1
            del _nodes[1:]
            _node_ids.clear()
            _named = 0


def after_fork_child() -> None:
    global _epoch, _lock, _ctr_first
    _lock = threading.RLock()
    _zero()
    mine = getattr(_local, "slots", None)
    if mine is not None:
        mine.native_id = threading.get_native_id()
    for t in list(_threads.values()):
        if t.perf is not None:
            t.perf.close()     # the inherited fds count the parent's threads
        t.perf, t.perf_gen = None, 0
    _ctr_first = None
    _epoch += 1


def current_path() -> tuple:
    f = _stack.get()
    node = f.node if f is not None and f.gen == _node_gen else 0
    out = []
    while node > 0:
        parent, name, _ = _nodes[node]
        out.append(name)
        node = parent
    return tuple(reversed(out))
