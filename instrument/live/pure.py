"""The hot path in pure Python: the same interface as the C extension
(`instrument._native`), chosen by instrument.live.backend when the extension is
missing or the configuration asks for it.  Slower, identical in what it records.
"""
from __future__ import annotations

import contextvars
import heapq
import math
import operator
import random
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Optional

from .. import histogram as _hist

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
_root_exit_hook = None   # called after every outermost stage exit (set_root_exit_hook)
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

_xm_k = 32        # exemplars kept per root stage: the K slowest calls and a sample of K (0: off)
_xm_stores: Dict[int, "_XmStore"] = {}
_xm_gen = 0       # _node_gen the stores' node ids are of
_xm_seq = 0
_xm_calls = 0     # root calls open (the C backend's pool holds at least this many)
_xm_rng = random.Random(0x9E3779B9)
XM_MAX_PARTS = 64
XM_MAX_K = 1024
XM_MAX_ROOTS = 256
ITEMS_MAX = 32
ITEM_NAME_MAX = 200

_ring: List[Optional[tuple]] = []
_ring_next = 0
_ring_total = 0


def _warn_once(key: str, msg: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    try:
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    except Exception:
        pass


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
# slot: [calls, errors, cpu_calls, wall_total, wall_self, wall_min, wall_max, cpu_total, cpu_self, hist, counters,
#        items]
# counters: None or a list per event of [total, self, enabled, running, counted, scaled]
# items: {name: [int_total, float_total, calls, float_calls]}
def _new_slot() -> list:
    return [0, 0, 0, 0, 0, sys.maxsize, 0, 0, 0, {}, None, {}]


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
    for name, v in s[11].items():
        it = _item_slot(d[11], name)
        for k in range(4):
            it[k] += v[k]


def _item_slot(items: dict, name: str) -> list:
    it = items.get(name)
    if it is None:
        if len(items) >= ITEMS_MAX and name != OTHER_NAME:
            _warn_once("items", f"instrument: more than {ITEMS_MAX} distinct item names in one stage; the others are "
                       f"added up as '{OTHER_NAME}'")
            return _item_slot(items, OTHER_NAME)
        it = items[name] = [0, 0.0, 0, 0]
    return it


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
                 "nvtx", "nvtx_id", "c0", "child_c", "gen", "cpu_src", "open", "xm", "xm_child")

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
        f.xm, f.xm_child = None, 0
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
        if _xm_k:
            _xm_enter(f, parent)
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
        if f.xm is not None and f.xm.open:
            _xm_exit(f, wall, slots)
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
    if f.parent is None and _root_exit_hook is not None:   # an outermost call is complete
        try:
            _root_exit_hook()
        except Exception:
            _internal_failure("root exit hook")


# ----------------------------------------------------------------- exemplars
# The same bookkeeping as csrc/exemplars.c: a root stage's call collects the self time of every stage that closes
# in the same context while it is open; at its exit the call is offered to the root's store (the K slowest calls
# in a min-heap, a uniform reservoir of K).  The context is told by thread and asyncio task.
class _XmCall:
    __slots__ = ("seq", "parts", "root", "key", "open")   # root: id() of the root frame (no cycle with it)


class _XmStore:
    __slots__ = ("seen", "slow", "res")

    def __init__(self) -> None:
        self.seen = 0
        self.slow: list = []    # heap of (wall, seq, t0, tid, parts)
        self.res: list = []     # (wall, seq, t0, tid, parts)


def _context_key() -> tuple:
    """Thread and asyncio task: the pure twin's stand-in for the C backend's per-context stack."""
    return _get_ident(), id(_current_task()) if _in_event_loop() else 0


def _current_task():
    return sys.modules["asyncio"].current_task()


_get_ident = threading.get_ident


def _xm_enter(f: "_Frame", parent) -> None:
    global _xm_seq, _xm_calls
    if _nodes[f.node][0] == 0:
        c = _XmCall()
        _xm_seq += 1
        _xm_calls += 1
        c.seq, c.parts, c.root, c.key, c.open = _xm_seq, {}, id(f), _context_key(), True
        f.xm = c
    elif parent is not None and parent.xm is not None and parent.xm.open and parent.xm.key == _context_key():
        f.xm = parent.xm


def _xm_exit(f: "_Frame", wall: int, slots: "_ThreadSlots") -> None:
    global _xm_calls
    c = f.xm
    parts = c.parts
    node = f.node
    if node not in parts and len(parts) >= XM_MAX_PARTS - 1:
        node = -1
    # self time within the call's own context (as the C backend's stack counts it): children in other tasks left out
    parts[node] = parts.get(node, 0) + max(wall - f.xm_child, 0)
    p = f.parent
    if p is not None and p.xm is c:
        p.xm_child += wall
    if c.root != id(f):
        return
    c.open = False
    _xm_calls -= 1
    if f.epoch == _epoch and _xm_k:
        _xm_offer(f.node, c.seq, wall, f.t0, slots.native_id, parts)


def _xm_offer(root: int, seq: int, wall: int, t0: int, tid: int, parts: dict) -> None:
    global _xm_gen
    if _xm_gen != _node_gen:
        _xm_stores.clear()
        _xm_gen = _node_gen
    st = _xm_stores.get(root)
    if st is None:
        if len(_xm_stores) >= XM_MAX_ROOTS:
            _warn_once("exemplar roots", f"instrument: calls of more than {XM_MAX_ROOTS} top-level stages; the calls "
                       "of further ones are not kept as exemplars")
            return
        st = _xm_stores[root] = _XmStore()
    st.seen += 1
    slow, res, k = st.slow, st.res, _xm_k
    to_slow = len(slow) < k or wall > slow[0][0]
    j = len(res) if len(res) < k else int(_xm_rng.random() * st.seen)
    if not to_slow and j >= k:
        return                      # the steady state: this call is kept nowhere
    x = (wall, seq, t0, tid & 0xFFFFFFFF, list(parts.items()))
    if to_slow:
        (heapq.heappush if len(slow) < k else heapq.heapreplace)(slow, x)
    if len(res) < k:
        res.append(x)
    elif j < k:
        res[j] = x


def _parts_cap(n: int) -> int:
    c = 4
    while c < n:
        c *= 2
    return min(c, XM_MAX_PARTS)


def _xm_bytes() -> tuple:
    """The memory the C backend's layout would hold for the stores, and for the open calls (the figures both
    backends report)."""
    calls = _xm_calls * (32 + 16 * 4)   # sizeof(XmCall) and room for 4 stages
    if not _xm_stores or _xm_gen != _node_gen:
        return 0, calls
    n = 16
    while n <= max(_xm_stores):
        n *= 2
    total = 8 * n   # sizeof(XmStore *) per node
    for st in _xm_stores.values():   # sizeof(XmStore), 2 arrays of sizeof(Xm) grown by doubling to K, 16 per part
        cap = 2
        while cap < len(st.slow):
            cap *= 2
        total += 32 + 2 * min(cap, _xm_k) * 48 + sum(16 * _parts_cap(len(x[4])) for x in st.slow + st.res)
    return total, calls


def _xm_collect() -> list:
    out = []
    if _xm_gen != _node_gen:
        return out
    for root, st in sorted(_xm_stores.items()):
        slow = {x[1] for x in st.slow}
        sampled = {x[1] for x in st.res}
        for wall, seq, t0, tid, parts in st.slow:
            out.append((root, seq, True, seq in sampled, wall, t0, tid, list(parts)))
        for wall, seq, t0, tid, parts in st.res:
            if seq not in slow:
                out.append((root, seq, False, True, wall, t0, tid, list(parts)))
    return out


# --------------------------------------------------------------------- items
def _item_value(value: Any):
    if type(value) is int:
        if value < 0:
            raise ValueError(f"add() value must be >= 0 (items are counted, not taken back), got {value!r}")
        return value, 0.0, 0
    if isinstance(value, bool):
        raise TypeError("add() value must be a number of items (int or float), not bool")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"add() value must be a finite number >= 0, got {value!r}")
        if value < 0:
            raise ValueError(f"add() value must be >= 0 (items are counted, not taken back), got {value!r}")
        return 0, float(value), 1
    if hasattr(type(value), "__index__"):
        return _item_value(operator.index(value))
    if hasattr(type(value), "__float__") and not isinstance(value, (str, bytes)):   # numpy floats, Decimal
        return _item_value(float(value))
    raise TypeError(f"add() value must be a number of items (int or float), not {type(value).__name__}")


def add(name: str, value: Any = 1) -> None:
    """add(name, value=1): items (tokens, samples, bytes, ...) of the innermost open stage of this context."""
    if not isinstance(name, str):
        raise TypeError(f"add() item name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("add() item name must not be empty")
    if len(name) > ITEM_NAME_MAX:
        raise ValueError(f"add() item name is {len(name)} characters long; at most {ITEM_NAME_MAX} are allowed")
    n, x, fl = _item_value(value)
    if not _enabled:
        return
    try:
        f = _stack.get()
        node = f.node if f is not None and f.gen == _node_gen else 0
        stats = _slots().stats
        s = stats.get(node)
        if s is None:
            s = stats[node] = _new_slot()
        it = _item_slot(s[11], str(name))
        it[0] += n
        it[1] += x
        it[2] += 1
        it[3] += fl
    except Exception:
        _internal_failure("add")


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


def configure(*, enabled=None, cpu_clock=None, max_stages=None, trace_events=None, nvtx=None, exemplars=None) -> None:
    global _enabled, _cpu_clock, _max_nodes, _ring, _ring_next, _ring_total, _nvtx, _xm_k
    if nvtx is not None:
        from . import nvtx as nvtx_module
        _nvtx = nvtx_module if nvtx and nvtx_module.backend() != "none" else None
    if max_stages is not None and max_stages < 1:
        raise ValueError(f"max_stages must be at least 1, got {max_stages}")
    if trace_events is not None and trace_events < 0:
        raise ValueError(f"trace_events must be 0 or more, got {trace_events}")
    if exemplars is not None and not 0 <= exemplars <= XM_MAX_K:
        raise ValueError(f"exemplars must be from 0 to {XM_MAX_K}, got {exemplars}")
    if exemplars is not None and exemplars != _xm_k:
        _xm_stores.clear()
        _xm_k = int(exemplars)
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


def set_root_exit_hook(hook) -> None:
    global _root_exit_hook
    if hook is not None and not callable(hook):
        raise TypeError(f"set_root_exit_hook needs a callable or None, not {type(hook).__name__}")
    _root_exit_hook = hook


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
                                None if s[10] is None else [list(c) for c in s[10]],
                                {k: list(v) for k, v in s[11].items()}])
        nodes = [(i, p, n, o) for i, (p, n, o) in enumerate(_nodes) if i > 0]
        threads = len(_threads)
    stats = [{"node": nid, "calls": s[0], "errors": s[1], "wall_total": s[3], "wall_self": s[4], "wall_min": s[5],
              "wall_max": s[6], "cpu_calls": s[2], "cpu_total": s[7], "cpu_self": s[8], "hist": sorted(s[9].items()),
              "counters": [tuple(c) for c in s[10]] if s[10] is not None else [],
              "items": [(k, v[0], v[1], v[2], v[3]) for k, v in s[11].items()]}
             for nid, s in sorted(merged.items()) if s[0] or s[11]]
    n = min(_ring_total, len(_ring))
    start = 0 if _ring_total < len(_ring) else _ring_next
    events = [_ring[(start + k) % len(_ring)] for k in range(n)]
    res = dict(counter_errno=[None] * len(_ctr_events) if _ctr_first is None else list(_ctr_first["errno"]))
    if _ctr_first is not None:
        res["counter_open"] = {"exclude_kernel": _ctr_first["exclude_kernel"], "rdpmc": False}
    return dict(res, nodes=nodes, stats=stats, events=events, events_dropped=_ring_total - n, max_stages=_max_nodes,
                threads=threads, clock_ns=_perf_ns(), exemplars=_xm_collect(), exemplar_bytes=_xm_bytes(), **_counts)


def _zero() -> None:
    global _ring_next, _ring_total
    with _lock:
        for t in list(_threads.values()):
            t.stats.clear()
        _retired.clear()
        for k in _counts:
            _counts[k] = 0
        _ring_next = _ring_total = 0
        _xm_stores.clear()


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
