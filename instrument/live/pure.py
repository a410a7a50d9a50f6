"""The pure-Python fallback of the hot path, for where the C extension (`instrument._native`, csrc/) cannot be
imported.  It is not the recorder of normal execution: the C core is.  instrument.live.backend chooses it.

It has the stage interface of instrument/_native.pyi (all but CounterGroup, the nvtx_* functions, the asyncio
runners and the _perf_mmap_* decoders) and reads every call from the same sources as the C core: the wall clock,
the thread's CPU clock (or perf task-clock), the thread's rusage, the ctypes perf_event group (perf_ctypes.py),
NVTX through live/nvtx.py.  Its sums are exact: estimate rows carry the totals with variance 0 and reads equal
to the calls read.  What it lacks is MISSING; meta.backend, doctor and the report's footer name it.
"""
from __future__ import annotations

import contextvars
import math
import operator
import sys
import threading
import time
import types
import weakref
from typing import Any, Dict, List, Optional

try:
    import resource
    _RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)
except ImportError:      # not on this platform: no system time, no context switches
    resource, _RUSAGE_THREAD = None, None  # type: ignore[assignment]

from .. import histogram as _hist
from . import callsite

# what the C core records and this fallback does not: every call is read, nothing estimated or corrected
MISSING = ("overhead budget", "estimates", "exemplars", "asyncio task attribution", "machine probe", "run-queue time",
           "helper-thread CPU time", "switch detection", "calibration", "instrument's own cost apart", "GIL wait",
           "memory per stage", "a signal's save where the main thread is blocked")

MAX_NAME_LEN, HIST_SUB_BITS, HIST_BLOCKS = 1024, _hist.SUB_BITS, _hist.BLOCKS
HELPERS_MAX = 0   # helper threads' CPU is not read here (MISSING)
OTHER_NAME, ITEMS_MAX, ITEM_NAME_MAX, MAX_COUNTERS = "(other)", 32, 200, 16
NQ = 4 + MAX_COUNTERS   # per call: CPU time, system time, voluntary and involuntary switches, then the counters
SCALARS = ("cpu", "sys", "vcsw", "ivcsw")

_perf_ns, _thread_ns = time.perf_counter_ns, time.thread_time_ns
now_ns, thread_cpu_ns, hist_index = time.perf_counter_ns, time.thread_time_ns, _hist.index

_lock = threading.Lock()   # guards the node table and the sums; taken once per call, at its record
_options: Dict[str, Any] = {"enabled": True, "cpu_clock": True, "cpu_split": True, "nvtx": False, "max_stages": 10000,
                            "trace_events": 0, "exemplars": 32, "overhead_budget": None, "run_queue": True,
                            "helper_cpu": True, "gil_wait": True}
_enabled = _cpu_clock = _cpu_split = True
_nvtx = _hook_enter = _hook_exit = _root_exit_hook = None   # _nvtx: instrument.live.nvtx while NVTX emission is on
_ctr_events: List[tuple] = []    # [(type, config)] every thread opens
_ctr_excl, _ctr_taskclock, _ctr_gen = False, -1, 1
_ctr_first: Optional[dict] = None   # what the first thread's open gave: errno per event, exclude_kernel
_counts = dict.fromkeys(("unmatched_exits", "out_of_order_exits", "cross_thread_exits", "internal_failures",
                         "folded_calls"), 0)
_warned: set = set()

# the node table: id -> (parent, name, is "(other)"); (parent, name) -> id.  Node 0 is the root.
_nodes: List[tuple] = [(-1, None, 0)]
_node_ids: Dict[tuple, int] = {}
_named, _node_gen = 0, 1         # distinct stages named; bumped when the table is rebuilt (older frames name no node)
_open = 0                        # frames open anywhere: the node table is rebuilt by reset() only at 0
_stats: Dict[int, "_Sums"] = {}
_ring: List[Optional[tuple]] = []   # the trace ring: (node, tid, t0, wall, cpu0, cpu)
_ring_next = _ring_total = 0


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        callsite.warn(msg)


def _internal_failure(what: str) -> None:
    _counts["internal_failures"] += 1
    _warn_once(what, f"instrument: internal failure in {what}; measurement goes on without it")


def _node_child(parent: int, name: str) -> int:
    """The node of `name` under `parent`; past max_stages distinct stages, the parent's "(other)" node."""
    global _named
    nid = _node_ids.get((parent, name))
    if nid is not None:
        return nid
    with _lock:
        nid = _node_ids.get((parent, name))
        if nid is None and _named < _options["max_stages"]:
            _named += 1
            nid = _node_ids[(parent, name)] = len(_nodes)
            _nodes.append((parent, name, 0))
        elif nid is None:
            _counts["folded_calls"] += 1
            if _nodes[parent][2]:
                return parent
            nid = _node_ids.get((parent, OTHER_NAME))
            if nid is None:
                nid = _node_ids[(parent, OTHER_NAME)] = len(_nodes)
                _nodes.append((parent, OTHER_NAME, 1))
                _warn_once("cardinality", f"instrument: more than {_options['max_stages']} distinct stages; new ones "
                           f"are folded into '{OTHER_NAME}' (configure(max_stages=...) raises the cap)")
        return nid


class _Sums:
    """A node's exact sums: calls, wall time, its histogram, and per quantity [total, self, calls read]."""
    __slots__ = ("calls", "errors", "wall_total", "wall_self", "wall_min", "wall_max", "hist", "covered", "cov_run",
                 "cov_run_self", "q", "mux", "items")

    def __init__(self) -> None:
        self.calls = self.errors = self.wall_total = self.wall_self = self.wall_max = self.covered = self.cov_run = 0
        self.cov_run_self, self.wall_min = 0, sys.maxsize
        self.hist: Dict[int, int] = {}
        self.q: Optional[List[list]] = None     # made on the first call read
        self.mux = [[0, 0, 0] for _ in range(MAX_COUNTERS)]   # per counter: enabled, running, calls scaled
        self.items: Dict[str, list] = {}        # name -> [int total, float total, adds, float adds]


class _Thread:
    """A thread's counter group: opened on its first stage, or after the events changed; its fds close with it."""
    __slots__ = ("perf", "gen", "tid", "__weakref__")

    def __init__(self) -> None:
        self.perf, self.gen, self.tid = None, 0, threading.get_native_id()
        _threads.add(self)

    def counters(self):
        global _ctr_first
        if self.gen != _ctr_gen:
            if self.perf is not None:
                self.perf.close()
            from .perf_ctypes import CounterGroup
            self.perf, self.gen = CounterGroup(_ctr_events, exclude_kernel=_ctr_excl), _ctr_gen
            if _ctr_first is None:
                _ctr_first = {"errno": list(self.perf.status), "exclude_kernel": bool(self.perf.exclude_kernel)}
        return self.perf


_threads: "weakref.WeakSet[_Thread]" = weakref.WeakSet()
_local = threading.local()


def _thread() -> _Thread:
    try:
        return _local.t
    except AttributeError:
        _local.t = t = _Thread()
        return t


def _read(th: _Thread) -> Optional[tuple]:
    """One boundary's readings: (CPU time, its source, rusage, counters, their generation); None: nothing to read."""
    ctr, cpu, src, ru = None, -1, 0, None
    if _ctr_events:
        ctr = th.counters().read()
        if _ctr_taskclock >= 0 and ctr[_ctr_taskclock][2]:
            cpu, src = ctr[_ctr_taskclock][0], 2
    if src == 0 and _cpu_clock:
        cpu, src = _thread_ns(), 1
    if _cpu_split and _RUSAGE_THREAD is not None:
        ru = resource.getrusage(_RUSAGE_THREAD)
    if src == 0 and ru is None and ctr is None:
        return None
    return cpu, src, ru, ctr, _ctr_gen


def _quantities(r0: tuple, r1: tuple) -> tuple:
    """A call's values (the first of NQ; None where not read at both ends, or not by the same source) and its
    counters' (enabled, running) time."""
    x: List[Optional[float]] = [None] * 4
    mux = []
    if r0[1] and r0[1] == r1[1]:
        x[0] = float(r1[0] - r0[0])
    if r0[2] is not None and r1[2] is not None:
        a, b = r0[2], r1[2]
        x[1] = round((b.ru_stime - a.ru_stime) * 1e6) * 1000.0
        x[2], x[3] = float(b.ru_nvcsw - a.ru_nvcsw), float(b.ru_nivcsw - a.ru_nivcsw)
    if r0[3] is not None and r1[3] is not None and r0[4] == r1[4] == _ctr_gen:
        for (v0, e0, n0), (v1, e1, n1) in zip(r0[3], r1[3]):
            de, dr = e1 - e0, n1 - n0   # multiplexed: scaled by enabled / running; never ran: no value (not 0)
            x.append(None if dr == 0 else float(v1 - v0) if dr == de else (v1 - v0) * de / dr)
            mux.append((de, dr))
    return x, mux


class _Frame:
    __slots__ = ("stage", "node", "gen", "parent", "th", "t0", "r0", "child_wall", "child", "hook", "nvtx", "open",
                 "tok")

    def __del__(self) -> None:   # its context died with it open (a task destroyed pending): reset() may forget it
        global _open
        _open -= self.open is True


_current: contextvars.ContextVar = contextvars.ContextVar("instrument_frame", default=None)   # this context's innermost
_early: contextvars.ContextVar = contextvars.ContextVar("instrument_early", default=())   # closed with an outer stage


def _enter(stage: "Stage") -> None:
    global _open
    if not _enabled:
        return
    try:
        th = _thread()
        parent = _current.get()
        f = _Frame()
        f.stage, f.parent, f.th, f.gen, f.open = stage, parent, th, _node_gen, True
        f.node = _node_child(parent.node if parent is not None and parent.gen == _node_gen else 0, stage.name)
        f.child_wall, f.child, f.hook, f.nvtx, f.r0 = 0, None, None, 0, None
        f.tok = _current.set(f)   # before the hook, as in the C core: current_path() includes this stage
        _open += 1
        if _hook_enter is not None:
            try:
                f.hook = _hook_enter(stage.name)
            except Exception:
                _internal_failure("integration enter hook")
        if _nvtx is not None:   # in an event loop a process range: a task's may end on another thread's stack
            ev = sys.modules.get("asyncio.events")
            f.nvtx = (_nvtx.start(stage.name, stage.color, stage.category) if ev and ev._get_running_loop() else
                      (_nvtx.push(stage.name, stage.color, stage.category), -1)[1])
        f.t0 = _perf_ns()   # the wall window holds the reads, the CPU window none of the wall's
        f.r0 = _read(th)
    except Exception:
        _internal_failure("stage enter")


def _close(f: _Frame, error: bool) -> None:
    """Closes f: its readings, its record (into its node's sums and its parent's children), its integrations."""
    global _open, _ring_next, _ring_total
    th = _thread()
    try:
        r1 = _read(th) if f.r0 is not None and f.th is th else None
        wall = _perf_ns() - f.t0
        f.open = False
        _open -= 1
        if f.th is not th:
            _counts["cross_thread_exits"] += 1
            _warn_once("thread", f"instrument: stage {f.stage.name!r} was exited on another thread than it was "
                       "entered on; its CPU time is not recorded for that call")
        x, mux = _quantities(f.r0, r1) if r1 is not None else (None, None)
        p = f.parent
        if p is not None:
            p.child_wall += wall
            if x is not None:
                p.child = p.child or [0.0] * NQ
                for k, v in enumerate(x):
                    if v is not None:
                        p.child[k] += v
        if f.gen == _node_gen:
            with _lock:
                _record((_stats.get(f.node) or _stats.setdefault(f.node, _Sums())), f, wall, x, mux, error)
                if _ring:
                    cpu = x[0] if x is not None and x[0] is not None else None
                    _ring[_ring_next] = (f.node, th.tid, f.t0, wall, f.r0[0] if cpu is not None else -1,
                                         int(max(cpu, 0)) if cpu is not None else -1)
                    _ring_next, _ring_total = (_ring_next + 1) % len(_ring), _ring_total + 1
        if f.hook is not None and _hook_exit is not None:
            try:
                _hook_exit(f.hook)
            except Exception:
                _internal_failure("integration exit hook")
        if f.nvtx > 0:
            _nvtx.end(f.nvtx)
        elif f.nvtx < 0 and f.th is th:
            _nvtx.pop()
    except Exception:
        _internal_failure("stage exit")
    if f.parent is None and _root_exit_hook is not None:   # an outermost call is complete
        try:
            _root_exit_hook()
        except Exception:
            _internal_failure("root exit hook")


def _record(s: _Sums, f: _Frame, wall: int, x: Optional[list], mux: Optional[list], error: bool) -> None:
    """One finished call into its node's sums: exact, every call read (no estimate, no correction)."""
    own = wall - f.child_wall   # not clamped per call: totals add up exactly (as csrc/record.c)
    s.calls, s.errors = s.calls + 1, s.errors + bool(error)
    s.wall_total, s.wall_self = s.wall_total + wall, s.wall_self + own
    s.wall_min, s.wall_max = min(s.wall_min, wall), max(s.wall_max, wall)
    i = _hist.index(wall)
    s.hist[i] = s.hist.get(i, 0) + 1
    if x is None:
        return
    s.covered, s.cov_run, s.cov_run_self = s.covered + 1, s.cov_run + wall, s.cov_run_self + own
    if s.q is None:
        s.q = [[0.0, 0.0, 0] for _ in range(NQ)]
    child = f.child
    for k, v in enumerate(x):
        if v is not None:
            q = s.q[k]
            q[0], q[1], q[2] = q[0] + v, q[1] + v - (child[k] if child is not None else 0.0), q[2] + 1
    for k, (de, dr) in enumerate(mux or ()):
        if x[4 + k] is not None:
            m = s.mux[k]
            m[0], m[1], m[2] = m[0] + de, m[1] + dr, m[2] + (dr != de)


def _exit(stage: "Stage", error: bool) -> None:
    f = g = _current.get()
    while g is not None and g.stage is not stage:
        g = g.parent
    early = _early.get() if g is None or not g.open else ()
    if stage in early:   # closed early with an outer stage: its exit was expected
        _early.set(tuple(s for s in early if s is not stage))
        return
    try:   # back to g's parent; refused unless this context entered g (not a copy of it)
        _current.reset(g.tok if g is not None and g.open else None)
    except (TypeError, ValueError, RuntimeError):   # no open frame of it here
        if _enabled:
            _counts["unmatched_exits"] += 1
            _warn_once("unmatched", f"instrument: stage {stage.name!r} exited on a different thread or task than it "
                       "was entered on (or exited twice); that call is not recorded")
        return
    if f is not g:   # inner stages still open: they close with this one, so none outlives it
        _counts["out_of_order_exits"] += 1
        _warn_once("order", f"instrument: stage {stage.name!r} exited while an inner stage was still open; the inner "
                   "stages are closed with it (their own exits later are ignored)")
        while f is not g:
            _early.set((_early.get() + (f.stage,))[-4:])
            _close(f, error)
            f = f.parent
    _close(g, error)


class Stage:
    """A named stage: `with stage:` times the block and nests it under the enclosing stage."""
    __slots__ = ("_name", "color", "category", "__weakref__")

    def __init__(self, name: str, color: Optional[int] = None, *, category: int = 0) -> None:
        if not isinstance(name, str):
            raise TypeError(f"stage name must be a str, not {type(name).__name__}")
        if not name:
            raise ValueError("stage name must not be empty")
        if len(name) > MAX_NAME_LEN:
            raise ValueError(f"stage name is {len(name)} characters long; at most {MAX_NAME_LEN} are allowed")
        self._name = sys.intern(name)
        if color is None:
            from .nvtx import color_for
            color = color_for(name)
        elif isinstance(color, bool) or not isinstance(color, int) or not 0 <= color <= 0xFFFFFFFF:
            raise ValueError(f"color must be an int 0xRRGGBB or 0xAARRGGBB, got {color!r}")
        elif color <= 0xFFFFFF:
            color |= 0xFF000000
        self.color, self.category = color, int(category)

    @property
    def name(self) -> str:
        return self._name

    def __enter__(self) -> "Stage":
        _enter(self)
        return self

    def __exit__(self, et, ev, tb) -> bool:
        _exit(self, et is not None)
        return False

    def __call__(self, *args, **kwargs):
        if len(args) != 1 or kwargs:
            raise TypeError(f"a stage used as a decorator takes the function alone: @instrument.stage({self._name!r}) "
                            "above a def")
        if _decorator is None:
            raise TypeError(f"stage {self._name!r} cannot decorate before instrument is imported")
        return _decorator(self, args[0])

    def __repr__(self) -> str:
        return f"instrument.stage({self._name!r})"


_decorator = None   # set_decorator(f): f(stage, func) is `@stage` on func, the live side's region wrapping


def set_decorator(f) -> None:
    global _decorator
    if not callable(f):
        raise TypeError(f"set_decorator needs a callable, not {type(f).__name__}")
    _decorator = f


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
    __slots__ = ("stage", "__dict__")   # a slot: `stage` is a member of the type, as on the C one

    def __init__(self, stage: Stage, func) -> None:
        if not isinstance(stage, Stage):
            raise TypeError(f"Region needs a Stage, not {type(stage).__name__}")
        if not callable(func):
            raise TypeError(f"region() needs a callable, not {type(func).__name__}")
        self.stage = stage
        self.__wrapped__ = func

    def __call__(self, *args, **kwargs):
        with self.stage:
            return self.__wrapped__(*args, **kwargs)

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<instrument.region {self.stage.name!r} of {self.__wrapped__!r}>"


def _item_value(value: Any) -> tuple:
    """(int part, float part, 1 if a float) of an add() value, or a clear error."""
    if isinstance(value, bool):
        raise TypeError("add() value must be a number of items (int or float), not bool")
    if type(value) is int or isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"add() value must be a finite number >= 0, got {value!r}")
        if value < 0:
            raise ValueError(f"add() value must be >= 0 (items are counted, not taken back), got {value!r}")
        return (value, 0.0, 0) if type(value) is int else (0, float(value), 1)
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
    f = _current.get()
    with _lock:
        node = f.node if f is not None and f.gen == _node_gen else 0
        items = (_stats.get(node) or _stats.setdefault(node, _Sums())).items
        if name not in items and len(items) >= ITEMS_MAX:
            _warn_once("items", f"instrument: more than {ITEMS_MAX} distinct item names in one stage; the others are "
                       f"added up as '{OTHER_NAME}'")
            name = OTHER_NAME
        it = items.setdefault(name, [0, 0.0, 0, 0])
        it[0], it[1], it[2], it[3] = it[0] + n, it[1] + x, it[2] + 1, it[3] + fl


def _check(name: str, ok, allowed: str):
    def check(v: Any) -> None:
        if isinstance(v, bool) or not ok(v):
            raise ValueError(f"{name} must be {allowed}, got {v!r}")
    return check


# the hot-path options (config.py marks them hot) and their checks, as csrc/module.c's table; exemplars,
# overhead_budget, run_queue, helper_cpu and gil_wait are taken and given back, and change nothing here (MISSING)
_CHECKS = {"max_stages": _check("max_stages", lambda v: isinstance(v, int) and 1 <= v <= 10_000_000,
                                "an integer from 1 to 10000000"),
           "trace_events": _check("trace_events", lambda v: isinstance(v, int) and 0 <= v <= 100_000_000,
                                  "an integer from 0 to 100000000"),
           "exemplars": _check("exemplars", lambda v: isinstance(v, int) and 0 <= v <= 1024,
                               "an integer from 0 to 1024"),
           "overhead_budget": _check("overhead_budget",
                                     lambda v: v is None or isinstance(v, (int, float)) and 0 <= v <= 1,
                                     "None (read every call) or a number from 0 to 1")}


def configure(**options: Any) -> None:
    """The hot-path options (those config.py marks hot); every value checked before any is applied."""
    global _enabled, _cpu_clock, _cpu_split, _nvtx, _ring, _ring_next, _ring_total
    for k, v in options.items():
        if k not in _options:
            raise TypeError(f"configure() got an unknown option {k!r}; the hot-path options are: {', '.join(_options)}")
        _CHECKS.get(k, lambda v: None)(v)
    for k, v in options.items():
        _options[k] = v if k in _CHECKS else bool(v)
    _enabled, _cpu_clock, _cpu_split = _options["enabled"], _options["cpu_clock"], _options["cpu_split"]
    if "nvtx" in options:
        from . import nvtx as nvtx_module
        _nvtx = nvtx_module if _options["nvtx"] and nvtx_module.backend() != "none" else None
    if _options["trace_events"] != len(_ring):
        _ring, _ring_next, _ring_total = [None] * _options["trace_events"], 0, 0


def configuration() -> Dict[str, Any]:
    """The hot-path options in force, as configure() takes them."""
    return dict(_options, nvtx=_nvtx is not None)


NOT_MEASURED = "not measured by the pure-Python fallback"


def gil_status() -> Dict[str, Any]:
    """The C core's GIL sampler's status keys: none here (MISSING)."""
    return {"enabled": False, "mechanism": "none", "reason": NOT_MEASURED}


def calibrate(n: int = 200) -> Dict[str, Any]:
    """The keys of the C core's calibration; the fallback measures none of its costs (MISSING), and says so."""
    if not 1 <= n <= 1_000_000:
        raise ValueError(f"calibrate needs 1 to 1000000 rounds, got {n}")
    src = "task-clock" if _ctr_taskclock >= 0 else "thread-clock" if _cpu_clock else "none"
    return {"read_ns": 0.0, "base_ns": None, "cpu_bias_ns": 0, "inner_bias_ns": 0, "wall_bias_ns": 0,
            "unread_wall_bias_ns": 0, "cpu_source": src, "sys": bool(_cpu_split and _RUSAGE_THREAD is not None),
            "thread_clock": "time.thread_time_ns (the pure-Python fallback)", "switches": NOT_MEASURED,
            "run_queue": NOT_MEASURED, "helper_cpu": NOT_MEASURED}


def set_counters(events, exclude_kernel, taskclock_index) -> None:
    global _ctr_events, _ctr_excl, _ctr_taskclock, _ctr_gen, _ctr_first
    events = [(int(t), int(c)) for t, c in events]
    if len(events) > MAX_COUNTERS:
        raise ValueError(f"at most {MAX_COUNTERS} counters can be read per stage, got {len(events)}")
    with _lock:
        for s in _stats.values():   # the old events' sums would be read as the new ones'
            s.mux = [[0, 0, 0] for _ in range(MAX_COUNTERS)]
            for q in s.q[4:] if s.q is not None else ():
                q[:] = [0.0, 0.0, 0]
        _ctr_events, _ctr_excl = events, bool(exclude_kernel)
        _ctr_taskclock = taskclock_index if taskclock_index < len(events) else -1
        _ctr_gen += 1
        _ctr_first = None


def set_hooks(enter, exit) -> None:
    global _hook_enter, _hook_exit
    if (enter is None) != (exit is None):
        raise ValueError("set_hooks needs both hooks or neither")
    _hook_enter, _hook_exit = enter, exit


def _hook(name: str, hook):
    if hook is not None and not callable(hook):
        raise TypeError(f"{name} needs a callable or None, not {type(hook).__name__}")
    return hook


def set_root_exit_hook(hook) -> None:
    global _root_exit_hook
    _root_exit_hook = _hook("set_root_exit_hook", hook)


def set_probe_hook(hook) -> None:
    _hook("set_probe_hook", hook)   # taken and never called: the fallback has no machine probe (MISSING)


def _exact(q: Optional[list]) -> Optional[Dict[str, Any]]:
    """A quantity's row in the C core's estimate shape: the exact total and self, variance 0."""
    return {"total": q[0], "self": q[1], "var": 0.0, "var_self": 0.0, "reads": q[2]} if q is not None and q[2] else None


def _row(nid: int, s: _Sums) -> Dict[str, Any]:
    """One collect() stats row (a _StatsRow in instrument/_native.pyi)."""
    q = s.q or [None] * NQ
    counters = []
    for k in range(len(_ctr_events)):
        c = _exact(q[4 + k])
        if c is not None:
            c.update(enabled=s.mux[k][0], running=s.mux[k][1], scaled=s.mux[k][2])
        counters.append(c)
    cpu = _exact(q[0])
    return {"node": nid, "calls": s.calls, "errors": s.errors, "wall_total": s.wall_total, "wall_self": s.wall_self,
            "wall_min": s.wall_min, "wall_max": s.wall_max, "overlapped": 0, "abandoned": 0, "susp_total": 0,
            "susp_self": 0, "loop_total": 0, "loop_self": 0, "covered": s.covered, "cov_run": s.cov_run,
            "cov_run_self": s.cov_run_self, "cpu_bound": cpu["total"] if cpu is not None else 0.0,
            "hist": sorted(s.hist.items()),
            "estimates": dict({n: _exact(q[k]) for k, n in enumerate(SCALARS)}, cpu=cpu, runqueue=None, helpers=None,
                              off_samples=None, gil_samples=None),
            "counters": counters, "blockers": [], "items": [(k, *v) for k, v in s.items.items()],
            "memory": {}}


def collect() -> Dict[str, Any]:
    with _lock:
        nodes = [(i, p, n, o) for i, (p, n, o) in enumerate(_nodes) if i > 0]
        stats = [_row(nid, s) for nid, s in sorted(_stats.items()) if s.calls or s.items]
        n = min(_ring_total, len(_ring))
        start = 0 if _ring_total < len(_ring) else _ring_next
        events = [_ring[(start + k) % len(_ring)] for k in range(n)]
        dropped = _ring_total - n
    opened = _ctr_first
    res: Dict[str, Any] = {"counter_errno": [None] * len(_ctr_events) if opened is None else list(opened["errno"])}
    if opened is not None:
        res["counter_open"] = {"exclude_kernel": opened["exclude_kernel"], "rdpmc": False}
    return dict(res, nodes=nodes, stats=stats, events=events, events_dropped=dropped,
                max_stages=_options["max_stages"], threads=len(_threads), clock_ns=_perf_ns(),
                tasks=dict.fromkeys(("steps", "switch_reads", "unhooked_changes", "overlapped_calls",
                                     "abandoned_calls"), 0), **_counts)


def reset() -> None:
    global _named, _node_gen, _ring_next, _ring_total
    with _lock:
        _stats.clear()
        _counts.update(dict.fromkeys(_counts, 0))
        _ring_next = _ring_total = 0
        if _open == 0:   # open frames keep their node ids valid until they close
            _node_gen, _named = _node_gen + 1, 0
            del _nodes[1:]
            _node_ids.clear()


def after_fork_child() -> None:
    global _lock, _ctr_first
    _lock, _ctr_first = threading.Lock(), None   # another thread may have held it at the fork
    reset()
    for t in list(_threads):
        if t.perf is not None:
            t.perf.close()     # the inherited fds count the parent's threads
        t.perf, t.gen, t.tid = None, 0, threading.get_native_id()


def current_path() -> tuple:
    f = _current.get()
    node = f.node if f is not None and f.gen == _node_gen else 0
    out = []
    while node > 0:
        node, name, _ = _nodes[node]
        out.append(name)
    return tuple(reversed(out))
