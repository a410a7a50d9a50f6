"""The hot path in pure Python: the same interface as the C extension
(`instrument._native`), chosen by instrument.live.backend when the extension is
missing or the configuration asks for it.  Slower, identical in what it records.
"""
from __future__ import annotations

import contextvars
import heapq
import math
import operator
import os
import random
import sys
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

try:
    import resource
except ImportError:      # not on this platform: no system-time split
    resource = None  # type: ignore[assignment]

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
_root_exit_hook = None   # called after every outermost stage exit (set_root_exit_hook)
_probe_hook = None       # the machine probe (set_probe_hook): after an outermost exit at or past _probe_due
_probe_due = 0
_nvtx = None          # instrument.nvtx module while NVTX emission is on
_loop = None          # asyncio.events._get_running_loop once asyncio is imported
_ctr_events: list = []          # [(type, config)] every thread opens
_ctr_excl = False
_ctr_taskclock = -1
_ctr_gen = 1
_ctr_first: Optional[dict] = None   # what the first thread's open gave: errno per event, exclude_kernel
# the overhead budget, as csrc/enter_exit.c: short stages are read on a random subset of calls, weighted by 1 / chance
_budget = 0.0                   # share of a stage's time its reads may cost; 0: every call is read
_read_cost = 0.0                # ns one call's reads cost, from calibrate()
_cpu_bias = 0                   # ns of CPU time an empty read call records: taken out of every read call
_inner_bias = 0                 # ns between an empty read call's CPU reads: out of a read call's running time
_wall_bias = [0, 0]             # ns of the SDK's own work inside the wall window of an unread call, a read one
_cpu_split = False              # read the thread's rusage with the CPU time: system time, context switches
_run_queue = False              # read the thread's run-queue time (schedstat) with the CPU time
_helper_cpu = False             # read the CPU time of the process's threads that run no stage
MIN_READ_CHANCE = 1.0 / 65536
FIRST_READS = 8                 # a stage's first calls on a thread are read: its estimates start from them
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None) if resource is not None else None


_lock = threading.RLock()         # guards node creation, thread registry, folding; never taken per stage
_warned: set = set()
_counts = {"unmatched_exits": 0, "out_of_order_exits": 0, "cross_thread_exits": 0, "internal_failures": 0,
           "folded_calls": 0}
_tasks = {"steps": 0, "switch_reads": 0, "unhooked_changes": 0, "overlapped_calls": 0, "abandoned_calls": 0}

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
# One slot per node and thread, with csrc/stats.h NodeStats' fields and names.  The quantities a read call
# measures (csrc/stats.h Q_*), estimated over a node's covered calls as csrc/record.c does.
Q_CPU, Q_SYS, Q_VCSW, Q_IVCSW, Q_RQ, Q_HELPERS = range(6)
Q_SCALARS = Q_CTR = 6
SCALAR_NAMES = ("cpu", "sys", "vcsw", "ivcsw", "runqueue", "helpers")
_SUMS = ("calls", "errors", "wall_total", "wall_self", "overlapped", "abandoned", "susp_total", "susp_self",
         "loop_total", "loop_self", "covered", "cov_run", "cov_run_self")


STRATA_RUN = 4
STRATA = 2 * STRATA_RUN


def _stratum(run: float, switched: bool) -> int:
    """csrc/stats.h stratum(): < 16 µs, then steps of 64; and whether the thread left the CPU during the call."""
    b = 0 if run < 16000 else min(1 + (int(run // 16000).bit_length() - 1) // 6, STRATA_RUN - 1)
    return b + (STRATA_RUN if switched else 0)


_ST = ("n", "x", "w", "xx", "xw", "ww", "Wn", "Wx", "Ww")   # a stratum's sums (csrc/stats.h Estimate)


def _fit(m: Tuple[float, ...], per_call: bool = False) -> Tuple[float, float, float]:
    """csrc/stats.c fit(): (a, r, mse) of the better fit to read calls' sums m (as _ST), per call (a the mean) or
    per running ns (r the ratio), weighted by 1 / p; mse -1 below two reads."""
    n, x, w, xx, xw, ww, Wn, Wx, Ww = m
    ratio, mean = (Wx / Ww if Ww > 0 else 0.0), (Wx / Wn if Wn > 0 else 0.0)
    sse_w, sse_c = xx - 2 * ratio * xw + ratio * ratio * ww, xx - 2 * mean * x + mean * mean * n
    a, r, sse = (mean, 0.0, sse_c) if per_call or sse_c < sse_w else (0.0, ratio, sse_w)
    return a, r, (max(sse, 0.0) / (n - 1) if n >= 2 else -1.0)


def _per_call(q: int, switched: bool) -> bool:
    """csrc/stats.c per_call(): the work of calls that left the CPU is predicted per call, not per running ns."""
    return switched and q not in (Q_RQ, Q_HELPERS)


FEW_READS = 5   # below this many reads, a stratum's own spread is not trusted alone (csrc/stats.c)


def _predict_unread(m: Tuple[float, ...], nb: float, q: int, switched: bool, n: float, w: float,
                    rel: float, pool: float, onw: float) -> Tuple[float, float]:
    """csrc/stats.c predict_unread(): (prediction, variance) of n unread calls of running time w in all."""
    a, r, g = _fit(m, _per_call(q, switched))
    pred, run = a * n + r * w, w / n
    if nb < FEW_READS:
        if q in (Q_CPU, Q_SYS, Q_RQ) and not nb:   # within [0, w]; one that left the CPU anywhere in it
            pred = min(max(pred, 0.0), w)
            return pred, (max(pred, w - pred) / 2.576) ** 2
        one = run if q in (Q_CPU, Q_SYS, Q_RQ) else max(abs(pred / n), math.sqrt(rel) * run)
        if switched and q not in (Q_CPU, Q_SYS, Q_RQ):   # the longer calls are the ones a preemption falls on
            one = max(one, onw)
        g = max(g, one * one)
    if g == 0 and nb:   # reads that fit exactly: a kind none of them saw, at a rate below 3 / reads (rule of three)
        g = pool * min(3 / nb, 1)
    return pred, n * g + g * (n * n if not nb else w * w / m[5] if r else n * n / m[0])


UN, UW = 9, 10   # a cell's calls read that did not measure the quantity: number, running time


def _cell_sums(cells: List[list], b: int) -> Tuple[float, ...]:
    """The first nine sums (as _ST) of stratum b, or of all strata (b = -1)."""
    if b >= 0:
        return tuple(cells[b][:UN])
    return tuple(sum(c[k] for c in cells) for k in range(UN))


class _Est:
    """The sums a quantity's estimate comes from (csrc/stats.h Estimate): by stratum, a cell of the calls' totals
    over their running time and one of self over running self time; each cell _ST then UN, UW."""
    __slots__ = ("tot", "own", "reads")

    def __init__(self) -> None:
        self.tot = [[0.0] * (UW + 1) for _ in range(STRATA)]
        self.own = [[0.0] * (UW + 1) for _ in range(STRATA)]
        self.reads = 0

    def predict(self, q: int, run: float, switched: bool) -> float:
        if not self.reads:
            return 0.0
        b = _stratum(run, switched)
        a, r, _ = _fit(_cell_sums(self.tot, b if self.tot[b][0] else -1), _per_call(q, switched))
        return a + r * run

    def add(self, b: int, x: float, run: float, W: float, xs: float, run_self: float) -> None:
        for cell, v, w in ((self.tot[b], x, run), (self.own[b], xs, run_self)):
            for k, d in enumerate((1.0, v, w, v * v, v * w, w * w, W, W * v, W * w)):
                cell[k] += d
        self.reads += 1

    def unmeasured(self, b: int, run: float, run_self: float) -> None:
        self.tot[b][UN] += 1
        self.tot[b][UW] += run
        self.own[b][UN] += 1
        self.own[b][UW] += run_self

    def merge(self, o: "_Est") -> None:
        for mine, theirs in ((self.tot, o.tot), (self.own, o.own)):
            for a, b in zip(mine, theirs):
                for k in range(UW + 1):
                    a[k] += b[k]
        self.reads += o.reads


def _estimate_side(cells: List[list], un: List[float], uw: List[float], q: int) -> Tuple[float, float]:
    """csrc/stats.c estimate_side(): (sum, variance) over the totals' or self's cells."""
    rel = 0.0
    for b in range(STRATA):
        m = _cell_sums(cells, b)
        mse = _fit(m)[2]
        if mse >= 0 and m[2] > 0:
            rel = max(rel, mse / (m[2] / m[0]) ** 2)
    m = _cell_sums(cells, -1)
    pool = max(m[3] - m[1] * m[1] / m[0], 0.0) / (m[0] - 1) if m[0] >= 2 else 0.0   # csrc pooled_spread()
    xw, w = sum(cells[b][4] for b in range(STRATA_RUN)), sum(cells[b][2] for b in range(STRATA_RUN))
    onw = abs(xw / w) if w > 0 else 0.0   # csrc on_cpu_weighted_mean()
    total = var = 0.0
    for b in range(STRATA):
        n, w = un[b] + cells[b][UN], uw[b] + cells[b][UW]
        total += cells[b][1]
        if n:
            pred, v = _predict_unread(_cell_sums(cells, b if cells[b][0] else -1), cells[b][0], q, b >= STRATA_RUN,
                                      n, w, rel, pool, onw)
            total += pred
            var += v
    return total, var


class _Slot:
    __slots__ = _SUMS + ("wall_min", "wall_max", "hist", "un", "uw", "uws", "run_b", "calls_b", "cpu0", "entered", "cpu_bound",
                         "est", "mux", "blockers", "items")

    def __init__(self) -> None:
        for k in _SUMS:
            setattr(self, k, 0)
        self.wall_min, self.wall_max = sys.maxsize, 0
        self.hist: Dict[int, int] = {}
        # covered calls left unread, by stratum: number, running time, running self time
        self.un, self.uw, self.uws = [0.0] * STRATA, [0.0] * STRATA, [0.0] * STRATA
        self.run_b, self.calls_b = [0.0] * STRATA, [0.0] * STRATA   # covered calls by stratum: running time, number
        self.cpu0: Optional[int] = None   # a thread's slot: the thread's CPU clock before its first call
        self.entered = 0                  # calls entered under the overhead budget
        self.cpu_bound = 0.0              # merged slots: what their calls' CPU time cannot exceed
        self.est: Optional[List[_Est]] = None   # per quantity, made on the first read call
        self.mux: Optional[List[list]] = None   # per counter: [enabled, running, scaled] of the read calls
        self.blockers: Dict[int, int] = {}       # node -> ns it held the loop while this stage was ready
        self.items: Dict[str, _ItemSum] = {}

    def estimate(self, q: int) -> Tuple[float, float, float, float]:
        """csrc/stats.c stats_estimate(): (total, self, var, var_self) of quantity q."""
        e = self.est[q]
        total, var = _estimate_side(e.tot, self.un, self.uw, q)
        own, var_self = _estimate_side(e.own, self.un, self.uws, q)
        return total, own, var, var_self

    def mark_start(self, back: int) -> None:
        self.cpu0 = time.thread_time_ns() - back

    def mean_cpu(self) -> float:
        """csrc/stats.c stats_mean_cpu(): a stratum none of whose calls was read counts as on a CPU throughout."""
        e, cpu = self.est[Q_CPU], 0.0
        for b in range(STRATA):
            share = e.tot[b][1] / e.tot[b][2] if e.tot[b][2] > 0 else 1.0
            cpu += min(max(share, 0.0), 1.0) * self.run_b[b]
        return cpu / self.covered


class _ItemSum:
    __slots__ = ("n", "x", "calls", "floats")   # sum of int values, sum of float values, add() calls, float ones

    def __init__(self) -> None:
        self.n, self.x, self.calls, self.floats = 0, 0.0, 0, 0


BLOCKERS_MAX = 8


def _add_blocker(blockers: Dict[int, int], node: int, ns: int) -> None:
    if node not in blockers and node != -1 and len(blockers) >= BLOCKERS_MAX - 1:
        node = -1   # full: the last entry adds up the rest
    blockers[node] = blockers.get(node, 0) + ns


def _merge_slot(d: _Slot, s: _Slot, cpu_now: float) -> None:
    """Adds s into d (csrc/stats.c stats_merge): s a live thread's slot whose CPU clock reads cpu_now, or a merged
    one (cpu_now < 0)."""
    for k in _SUMS:
        setattr(d, k, getattr(d, k) + getattr(s, k))
    d.wall_min = min(d.wall_min, s.wall_min)
    d.wall_max = max(d.wall_max, s.wall_max)
    h = d.hist
    for i, c in s.hist.items():
        h[i] = h.get(i, 0) + c
    for b in range(STRATA):
        d.run_b[b] += s.run_b[b]
        d.calls_b[b] += s.calls_b[b]
        d.un[b] += s.un[b]
        d.uw[b] += s.uw[b]
        d.uws[b] += s.uws[b]
    d.cpu_bound += s.cpu_bound if cpu_now < 0 else cpu_now - s.cpu0 if s.cpu0 is not None else math.inf
    if s.est is not None:
        if d.est is None:
            d.est = [_Est() for _ in s.est]
        d.est += [_Est() for _ in range(len(s.est) - len(d.est))]
        for de, se in zip(d.est, s.est):
            de.merge(se)
    if s.mux is not None:
        if d.mux is None:
            d.mux = [[0, 0, 0] for _ in s.mux]
        for dm, sm in zip(d.mux, s.mux):
            for k in range(3):
                dm[k] += sm[k]
    for node, ns in s.blockers.items():
        _add_blocker(d.blockers, node, ns)
    for name, v in s.items.items():
        it = _item_slot(d.items, name)
        it.n, it.x, it.calls, it.floats = it.n + v.n, it.x + v.x, it.calls + v.calls, it.floats + v.floats


def _item_slot(items: Dict[str, "_ItemSum"], name: str) -> "_ItemSum":
    it = items.get(name)
    if it is None:
        if len(items) >= ITEMS_MAX and name != OTHER_NAME:
            _warn_once("items", f"instrument: more than {ITEMS_MAX} distinct item names in one stage; the others are "
                       f"added up as '{OTHER_NAME}'")
            return _item_slot(items, OTHER_NAME)
        it = items[name] = _ItemSum()
    return it


_retired: Dict[int, _Slot] = {}
_retired_cpu = 0   # CPU time of threads that ended after running stages (helper CPU leaves them out)
_threads: "weakref.WeakValueDictionary[int, _ThreadSlots]" = weakref.WeakValueDictionary()  # live threads' slots
STEP_RING = 64


class _ThreadSlots:
    """One thread's slots; folded into the retired slots when the thread ends."""
    __slots__ = ("stats", "native_id", "perf", "perf_gen", "tok", "htok", "changes", "ctx", "batch", "chain", "last",
                 "step_outer", "step_ctx", "step_handle", "step_t0", "step_node", "batch_t0", "spans", "rng", "sched_fd",
                 "cpu_clock_id", "cpu_seen", "sw", "__weakref__")

    def __init__(self) -> None:
        self.stats: Dict[int, _Slot] = {}
        self.perf = None
        self.perf_gen = 0
        # asyncio attribution (as csrc/taskclock.c): token of the last boundary's context, unhooked context changes,
        # the context the step hook runs, open loop iterations, and whether `last` may serve the next switch
        self.tok = None
        self.htok = None         # a token made in the context the step hook runs: tells that context from others
        self.changes = 0
        self.ctx = None
        self.batch = 0
        self.chain = False
        self.last: Optional[_Reading] = None
        self.step_outer = None   # the stack around the running step: it runs while the step's context has no stage open
        self.step_ctx = None
        self.step_handle = None  # the handle whose step runs: when the tasks it wakes count as ready
        self.step_t0 = 0
        self.step_node = (0, 0)  # (wall, node): the longest outermost stage of the step's context closed in it
        self.batch_t0 = 0        # when the loop iteration's first step started
        self.spans: List[tuple] = []   # the latest steps on the loop: (t0, t1, node)
        self.native_id = threading.get_native_id()
        self.rng = random.Random()   # which calls of a short stage are read (overhead budget)
        self.sched_fd = -1       # /proc/thread-self/schedstat; -2 unavailable
        try:
            self.cpu_clock_id = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):
            self.cpu_clock_id = None
        self.cpu_seen = 0
        self.sw = _switch_page()   # whether the thread left the CPU during a call (perf_ctypes.SwitchPage)
        with _lock:
            _threads[id(self)] = self

    def __del__(self) -> None:
        global _retired_cpu
        try:
            if self.perf is not None:
                self.perf.close()
            if self.sw is not None:
                self.sw.close()
            if self.sched_fd >= 0:
                os.close(self.sched_fd)
            with _lock:
                _threads.pop(id(self), None)
                cpu = _clock_ns(self.cpu_clock_id)   # its slots' calls took no more CPU than the thread
                _retired_cpu += cpu if cpu >= 0 else self.cpu_seen
                for nid, s in self.stats.items():
                    _merge_slot(_retired.setdefault(nid, _Slot()), s, cpu if cpu >= 0 else math.inf)
        except Exception:
            pass


_local = threading.local()
_switches = False   # calibrate() saw the switch page move when the thread slept: calls know it (csrc g_switches)


def _switch_page():
    try:
        from .perf_ctypes import SwitchPage
        return SwitchPage.open()
    except Exception:
        return None


def _switch_seq(slots: "_ThreadSlots") -> int:
    return slots.sw.seq() if _switches and slots.sw is not None else 0


def _slots() -> _ThreadSlots:
    try:
        return _local.slots
    except AttributeError:
        _local.slots = s = _ThreadSlots()
        return s


# ----------------------------------------------------------------- the stack
class _Frame:
    __slots__ = ("stage", "node", "parent", "slots", "epoch", "hook", "nvtx", "nvtx_id", "gen", "taint0", "susp0",
                 "loop0", "child_wall", "child_susp", "child_loop", "child", "r0", "xm", "xm_child", "w", "sw0", "sw_in",
                 "skipped")


class _Stack:
    """A context's open stages and task clock, as csrc/stack.c's Stack and csrc/taskclock.c keep them.

    The clock sums what the thread's readings advanced while the context was suspended by the step hook, so
    readings taken in it are task-relative.  A context owns the stack it made (checked with the token of the
    context variable that holds it: a copied context sees its parent's stack but cannot exit its stages)."""
    __slots__ = ("frames", "tok", "owner", "suspended", "ready", "n_read", "taint", "chg_mark", "clk", "s_wall",
                 "s_loop", "s_q", "s_gen", "s", "out", "early", "__weakref__")

    def __init__(self, owner) -> None:
        self.frames: List[_Frame] = []
        self.tok = None
        self.owner = owner         # the context the step hook ran it in (None: made outside a hooked step)
        self.suspended = False
        self.ready = 0             # when the suspended task was woken (it waits for the loop since); 0: not woken
        self.n_read = 0            # open frames read at enter: a task switch reads for them
        self.taint = self.chg_mark = 0
        self.clk = None            # (thread slots, epoch) the sums are of; None: none yet
        self.s_wall = self.s_loop = self.s_gen = 0
        self.s_q = [0] * Q_SCALARS
        self.s: Optional[list] = None
        self.out: Optional[_Reading] = None
        self.early: List["Stage"] = []   # stages closed with an outer one that exited first: their exits are ignored

    def __del__(self) -> None:
        # the context died with stages open (a task destroyed while pending): each is recorded up to the task's
        # last switch, and no longer holds the node table
        global _open
        try:
            frames, self.frames = self.frames, []
            _open -= len(frames)
            for i in range(len(frames) - 1, -1, -1):
                _abandon(self, frames, i)
        except Exception:
            pass


_stack: contextvars.ContextVar = contextvars.ContextVar("instrument_stack", default=None)   # innermost frame seen
_owned: contextvars.ContextVar = contextvars.ContextVar("instrument_owned_stack", default=None)
_mark: contextvars.ContextVar = contextvars.ContextVar("instrument_context_mark", default=None)
_hmark: contextvars.ContextVar = contextvars.ContextVar("instrument_hooked_mark", default=None)


def _marks() -> tuple:
    """Run in a handle's context by the step hook: a token of each mark, made in that context."""
    return _mark.set(None), _hmark.set(None)


def _in_hooked(slots: "_ThreadSlots") -> bool:
    """Whether the running context is the one the step hook runs (not an eager step or a context entered by hand)."""
    t = slots.htok
    if t is None:
        return False
    try:
        _hmark.reset(t)
    except (ValueError, RuntimeError):
        return False
    slots.htok = _hmark.set(None)
    return True


def _owns(st: _Stack) -> bool:
    """Whether the running context made `st` (its token was created in this very context)."""
    try:
        _owned.reset(st.tok)
    except (ValueError, RuntimeError, TypeError):
        return False
    st.tok = _owned.set(st)
    return True


def _stack_current(slots: "_ThreadSlots") -> _Stack:
    st = _owned.get()
    if st is None or not _owns(st):
        st = _Stack(slots.ctx if slots.ctx is not None and _in_hooked(slots) else None)
        st.tok = _owned.set(st)
    elif st.owner is not slots.ctx and slots.ctx is not None and _in_hooked(slots):
        st.owner = slots.ctx      # ran outside the hook until now: what its open stages saw is not attributable
        st.taint += 1
    return st


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


# ------------------------------------------------------ asyncio attribution
def _boundary(slots: "_ThreadSlots") -> None:
    """A stage boundary in another context than the last one, with no hook to account for it, counts a change."""
    t = slots.tok
    if t is not None:
        try:
            _mark.reset(t)
        except ValueError:          # the token was made in another context
            slots.changes += 1
            _tasks["unhooked_changes"] += 1
        except RuntimeError:
            pass
    slots.tok = _mark.set(None)


def _fold(slots: "_ThreadSlots", st: _Stack) -> None:
    if not st.suspended and st.chg_mark != slots.changes:   # changes while it ran taint its open stages
        st.taint += 1
        st.chg_mark = slots.changes


class _Reading:
    """One boundary's readings, as csrc/readings.h Reading: the time; the scalar quantities (cumulative, -1 unread);
    where CPU time came from (0 nowhere, 1 thread clock, 2 task-clock); the counters' generation (0: not read) and
    values; the fork epoch; whether everything the configuration reads was read."""
    __slots__ = ("t", "tq", "q", "cpu_src", "gen", "ctr", "epoch", "full")

    def __init__(self, t: int) -> None:
        self.t = self.tq = t   # tq: the time right at the CPU read, what the quantities' window is timed by
        self.q, self.cpu_src, self.gen, self.ctr, self.epoch, self.full = [-1] * Q_SCALARS, 0, 0, None, _epoch, False

    def copy(self) -> "_Reading":
        r = _Reading(self.t)
        r.tq, r.q, r.cpu_src, r.gen, r.ctr, r.epoch, r.full = (self.tq, list(self.q), self.cpu_src, self.gen, self.ctr,
                                                               self.epoch, self.full)
        return r


HELPERS_MAX_THREADS = 16
HELPERS_BASE = 1 << 50   # only deltas count: a base keeps a reading positive (-1 means unread)


def _clock_ns(clock_id, default: int = -1) -> int:
    try:
        return time.clock_gettime_ns(clock_id) if clock_id is not None else default
    except OSError:
        return default


SCHEDSTAT = "/proc/thread-self/schedstat"
SCHEDSTAT_ZERO = "unavailable (schedstat reads 0 0: the kernel keeps no scheduler statistics)"


def _sched_run_delay(slots: "_ThreadSlots") -> int:
    """ns this thread waited in the run queue (/proc/thread-self/schedstat, field 2), cumulative; -1.  A file whose
    time on a CPU reads 0 for the running thread itself keeps no statistics: -1, never a run queue of 0."""
    if slots.sched_fd == -2:
        return -1
    try:
        if slots.sched_fd == -1:
            slots.sched_fd = os.open(SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
            if int(os.pread(slots.sched_fd, 96, 0).split()[0]) == 0:
                raise ValueError(SCHEDSTAT_ZERO)
        return int(os.pread(slots.sched_fd, 96, 0).split()[1])
    except (OSError, IndexError, ValueError):
        slots.sched_fd = -2
        return -1


def _run_queue_source() -> str:
    """Where run-queue time comes from, or why it does not (as csrc/calibrate.c says it)."""
    if not _run_queue:
        return "off (the run_queue option)"
    if _sched_run_delay(_slots()) >= 0:
        return SCHEDSTAT
    try:
        with open(SCHEDSTAT) as f:
            return SCHEDSTAT_ZERO if int(f.read().split()[0]) == 0 else \
                "unavailable (/proc/thread-self/schedstat cannot be read)"
    except (OSError, IndexError, ValueError):
        return "unavailable (/proc/thread-self/schedstat cannot be read)"


def _live_threads() -> List["_ThreadSlots"]:
    """The live threads' slots, copied in one step: other threads add theirs meanwhile (iterating the weak
    dictionary itself would fail when one does)."""
    refs = list(_threads.data.values())   # one copy of a plain dict, under the GIL
    return [t for t in (r() for r in refs) if t is not None]


def _helpers_cpu() -> int:
    """The process's CPU time less that of every thread that has run a stage (live or ended); -1."""
    live = _live_threads()
    if len(live) > HELPERS_MAX_THREADS:
        return -1
    ours = _retired_cpu
    me = getattr(_local, "slots", None)
    for t in live:
        c = time.thread_time_ns() if t is me else _clock_ns(t.cpu_clock_id)
        if c >= 0:
            t.cpu_seen = c   # a thread ending meanwhile keeps its last value
        ours += t.cpu_seen
    return HELPERS_BASE + time.process_time_ns() - ours


def _read_rusage(r: _Reading) -> None:
    if _RUSAGE_THREAD is None:
        return
    try:
        u = resource.getrusage(_RUSAGE_THREAD)
    except OSError:
        return
    r.q[Q_SYS], r.q[Q_VCSW], r.q[Q_IVCSW] = int(round(u.ru_stime * 1e6)) * 1000, u.ru_nvcsw, u.ru_nivcsw


def _read_cpu(slots: "_ThreadSlots", r: _Reading) -> None:
    if _ctr_events and slots.perf is not None and slots.perf_gen == _ctr_gen:
        r.ctr, r.gen = slots.perf.read(), _ctr_gen
        if _ctr_taskclock >= 0 and r.ctr[_ctr_taskclock][2]:
            r.q[Q_CPU], r.cpu_src = r.ctr[_ctr_taskclock][0], 2
    if not r.cpu_src and _cpu_clock:
        r.q[Q_CPU], r.cpu_src = _thread_ns(), 1
    r.tq = _perf_ns()


def _read_boundary(slots: "_ThreadSlots", exit: bool) -> _Reading:
    """Everything the configuration reads, as csrc/readings.c: the CPU window innermost (t: the caller's)."""
    r = _Reading(0)
    r.full = True
    if not exit:
        if _run_queue:
            r.q[Q_RQ] = _sched_run_delay(slots)
        if _helper_cpu:
            r.q[Q_HELPERS] = _helpers_cpu()
        if _cpu_split:
            _read_rusage(r)
        _read_cpu(slots, r)
    else:
        _read_cpu(slots, r)
        if _cpu_split:
            _read_rusage(r)
        if _helper_cpu:
            r.q[Q_HELPERS] = _helpers_cpu()
        if _run_queue:
            r.q[Q_RQ] = _sched_run_delay(slots)
    return r


def _take_reading(slots: "_ThreadSlots", full: bool, exit_order: bool) -> _Reading:
    """A task switch's reading: what a read call reads where a read call is open in a context it switches; else
    only the time.  Its own cost falls on the side of its CPU read that is not the task's (csrc/taskclock.c)."""
    if not full:
        return _Reading(_perf_ns())
    r = _read_boundary(slots, exit_order)
    r.t = _perf_ns()
    _tasks["switch_reads"] += 1
    return r


def _clock_reset(st: _Stack, slots: "_ThreadSlots") -> None:
    st.clk = (slots, _epoch)
    st.s_wall = st.s_loop = st.s_gen = 0
    st.s_q = [0] * Q_SCALARS
    st.s = st.out = None


def _clock_for(st: _Stack, slots: "_ThreadSlots") -> bool:
    if st.clk is None:
        return False
    if st.clk[0] is not slots or st.clk[1] != _epoch:
        _clock_reset(st, slots)   # another thread, or a forked child: older frames are not comparable anyway
        st.taint += 1
    return True


def _suspend(slots: "_ThreadSlots", st: _Stack, r: _Reading) -> None:
    _fold(slots, st)
    if st.clk is None or st.clk[0] is not slots or st.clk[1] != _epoch:
        _clock_reset(st, slots)
    st.out = r
    st.suspended = True
    st.ready = 0


def _step_span(slots: "_ThreadSlots", t0: int, t1: int, node: int) -> None:
    slots.spans.append((t0, t1, node))
    if len(slots.spans) > STEP_RING:
        del slots.spans[0]


def _charge_blockers(slots: "_ThreadSlots", node: int, start: int, end: int) -> None:
    """The steps that ran on the loop between start and end, charged as blockers of `node`."""
    s = slots.stats.get(node)
    if s is None:
        s = slots.stats[node] = _Slot()
    for t0, t1, n in reversed(slots.spans):
        if t1 <= start:
            break
        a, b = max(t0, start), min(t1, end)
        if b > a and n:
            _add_blocker(s.blockers, n, b - a)


def _add_suspension(st: _Stack, out: _Reading, r: _Reading) -> None:
    for k in range(Q_SCALARS):
        if (out.q[k] >= 0) != (r.q[k] >= 0) or (k == Q_CPU and out.cpu_src != r.cpu_src):
            st.taint += 1
        elif r.q[k] >= 0:
            st.s_q[k] += r.q[k] - out.q[k]
    if out.gen and out.gen == r.gen:
        if st.s_gen != r.gen or st.s is None:
            st.s, st.s_gen = [[0, 0, 0] for _ in r.ctr], r.gen
        for acc, (v0, e0, n0), (v1, e1, n1) in zip(st.s, out.ctr, r.ctr):
            acc[0] += v1 - v0
            acc[1] += e1 - e0
            acc[2] += n1 - n0
    elif out.gen != r.gen:
        st.taint += 1


def _resume(slots: "_ThreadSlots", st: _Stack, r: _Reading) -> None:
    clk, out = st.clk, st.out
    if not st.suspended or clk is None or clk[0] is not slots or clk[1] != _epoch or out is None or out.epoch != r.epoch:
        st.taint += 1             # it ran where no hook saw it leave, or elsewhere
        if clk is not None and (clk[0] is not slots or clk[1] != _epoch):
            _clock_reset(st, slots)
    else:
        st.s_wall += r.tq - out.tq   # timed at the CPU reads: running time and CPU time stay comparable
        ready = max(st.ready, out.tq)
        if st.ready and r.tq > ready:
            st.s_loop += r.tq - ready
            if st.frames:
                _charge_blockers(slots, st.frames[-1].node, ready, r.tq)
        if st.n_read:
            _add_suspension(st, out, r)
    st.suspended = False
    st.ready = 0
    st.chg_mark = slots.changes


def _relative(r: _Reading, st: _Stack) -> None:
    """A reading made relative to the stack's task: what advanced while it was suspended taken out."""
    for k in range(Q_SCALARS):
        if r.q[k] >= 0:
            r.q[k] -= st.s_q[k]
    if r.gen and st.s is not None and st.s_gen == r.gen:
        r.ctr = [(v - a[0], e - a[1], n - a[2]) for (v, e, n), a in zip(r.ctr, st.s)]
    if r.cpu_src == 2:
        r.q[Q_CPU] = r.ctr[_ctr_taskclock][0]


def _task_enter(slots: "_ThreadSlots", st: _Stack, f: _Frame) -> None:
    f.child_susp = f.child_loop = f.susp0 = f.loop0 = 0
    _boundary(slots)
    _fold(slots, st)
    slots.chain = False
    o = slots.step_outer
    if o is not None and len(st.frames) == 1 and st is not o and not o.suspended and st.owner is slots.step_ctx:
        # the step's context opens its first stage: the stage around the step stops here
        _suspend(slots, o, _take_reading(slots, o.n_read > 0, False) if not f.w or not o.n_read else f.r0.copy())
    has = _clock_for(st, slots)
    f.taint0 = st.taint
    if not has:
        return
    f.susp0, f.loop0 = st.s_wall, st.s_loop
    if f.w:
        _relative(f.r0, st)


def _task_exit(slots: "_ThreadSlots", st: _Stack, f: _Frame, r1: Optional[_Reading], m: "_Measure") -> bool:
    """The exit reading made task-relative; the call's suspended and loop-ready time into m; whether it overlapped."""
    _boundary(slots)
    _fold(slots, st)
    slots.chain = False
    o = slots.step_outer
    if o is not None and len(st.frames) == 1 and st is not o and o.suspended and st.owner is slots.step_ctx:
        # its last stage closes: the stage around the step resumes
        _resume(slots, o, _take_reading(slots, o.n_read > 0, True) if r1 is None or not o.n_read else r1.copy())
    if len(st.frames) == 1 and st.owner is slots.step_ctx and slots.step_t0:   # who held the loop in this step
        slots.step_node = max(slots.step_node, (_perf_ns() - f.r0.t, f.node))
    if _clock_for(st, slots):
        if r1 is not None:
            _relative(r1, st)
        m.susp, m.loop = max(st.s_wall - f.susp0, 0), max(st.s_loop - f.loop0, 0)
    over = st.taint != f.taint0
    if over:
        _tasks["overlapped_calls"] += 1
    return over


def _budget_read(slots: "_ThreadSlots", node: int) -> float:
    """The weight of this call's readings under the overhead budget: 1 / its chance of being read; 0: not read.
    The chance is the budget's share of the stage's predicted CPU time per call over what one call's reads cost
    (as csrc/enter_exit.c)."""
    if _budget <= 0 or _read_cost <= 0:
        return 1.0
    s = slots.stats.get(node)
    if s is None:
        s = slots.stats[node] = _Slot()
    if s.cpu0 is None:
        s.mark_start(0)                # the CPU clock before the node's first call here
    s.entered += 1
    if s.entered <= FIRST_READS:
        return 1.0                     # a stage's first calls on a thread are read
    # calls entered before the first ones finished (many tasks at once): FIRST_READS / entered, as csrc/enter_exit.c
    p = FIRST_READS / s.entered if s.covered < FIRST_READS or s.est is None else _budget * s.mean_cpu() / _read_cost
    if p >= 1.0:
        return 1.0                     # long enough for a read on every call
    p = max(p, MIN_READ_CHANCE)
    return 1.0 / p if slots.rng.random() < p else 0.0


# ------------------------------------------------------- recording a call
class _Measure:
    """A finished call as csrc/record.h CallMeasure describes it: the one thing _record takes, from a normal exit
    and from a call whose context died with it open."""
    __slots__ = ("wall", "susp", "loop", "inner", "switched", "switched_in", "x", "mux", "read", "overlapped",
                 "stand_in", "abandoned", "error")

    def __init__(self, wall: int, susp: int = 0, loop: int = 0, read: bool = False, overlapped: bool = False,
                 stand_in: bool = False, abandoned: bool = False, error: bool = False) -> None:
        self.wall, self.susp, self.loop, self.read = wall, susp, loop, read
        self.inner = 0   # a read call: the time between its CPU reads (_Reading.tq), what its quantities span
        self.switched = True   # its thread left the CPU during it (or that is not known)
        self.switched_in = True   # of a read call, between its CPU reads (csrc/record.h); else as switched
        self.x: Optional[list] = None   # per quantity: the call's value, None where not measured
        self.mux: Optional[list] = None  # per counter: (enabled, running) of the call
        self.overlapped, self.stand_in, self.abandoned, self.error = overlapped, stand_in, abandoned, error


def _call_quantities(r0: _Reading, r1: _Reading, m: _Measure) -> None:
    x: List[Optional[float]] = [None] * (Q_CTR + len(_ctr_events))
    for q in range(Q_SCALARS):
        if r0.q[q] >= 0 and r1.q[q] >= 0 and (q != Q_CPU or r0.cpu_src == r1.cpu_src):
            x[q] = float(r1.q[q] - r0.q[q])
    if r0.gen and r0.gen == r1.gen == _ctr_gen:
        m.mux = []
        for k, ((v0, e0, n0), (v1, e1, n1)) in enumerate(zip(r0.ctr, r1.ctr)):
            de, dr = e1 - e0, n1 - n0
            # multiplexed: scale by enabled/running; never ran: no value (not 0)
            x[Q_CTR + k] = None if dr == 0 else float(v1 - v0) if dr == de else (v1 - v0) * (de / dr)
            m.mux.append((de, dr))
    m.x = x


def _correct(m: _Measure) -> None:
    """The SDK's own work inside a call's windows (calibrate()) taken out of its wall time, and of a read call's CPU
    time; single calls are not clamped (that would bias the sums): the totals are bounded where reported."""
    m.wall = max(m.wall - _wall_bias[1 if m.read else 0], 0)
    m.susp = min(m.susp, m.wall)
    m.loop = min(m.loop, m.susp)
    if not m.read or m.x is None or m.x[Q_CPU] is None:
        return
    m.x[Q_CPU] -= _cpu_bias
    if m.mux is not None and _ctr_taskclock >= 0 and m.x[Q_CTR + _ctr_taskclock] is not None:
        m.x[Q_CTR + _ctr_taskclock] = m.x[Q_CPU]


def _estimate_call(s: _Slot, f: _Frame, m: _Measure, want: bool) -> Optional[list]:
    """The call's part of each estimate's sums (csrc/record.c estimate_call); the per-call values if want."""
    run, child = m.wall - m.susp, f.child_wall - f.child_susp
    s.covered += 1
    s.cov_run += run
    s.cov_run_self += run - child
    if m.read:   # what predicts a call: a read one's running time between its CPU reads (as csrc/record.c)
        run = max(m.inner - m.susp - _inner_bias, 0)
    run_self = run - child
    nq = Q_CTR + len(_ctr_events)
    # a read call's stratum for its CPU time and counters is judged between its CPU reads, their window; its other
    # quantities span the reads, and so does their stratum (as csrc/record.c)
    b, b_out = _stratum(run, m.switched_in), _stratum(run, m.switched)
    s.run_b[b] += run
    s.calls_b[b] += 1
    if not m.read:
        s.un[b] += 1
        s.uw[b] += run
        s.uws[b] += run_self
        return [e.predict(q, run, m.switched) for q, e in enumerate(s.est[:nq])] if want and s.est is not None else None
    if s.est is None or len(s.est) < nq:
        s.est = (s.est or []) + [_Est() for _ in range(nq - len(s.est or []))]
    out = [0.0] * nq
    for q in range(nq):
        t = s.est[q]
        inner = q == Q_CPU or q >= Q_CTR
        bq = b if inner else b_out
        x = m.x[q] if m.x is not None and q < len(m.x) else None
        if x is None:   # not measured on this call: it counts as unread for this quantity
            t.unmeasured(bq, run, run_self)
            out[q] = t.predict(q, run, m.switched_in if inner else m.switched)
            continue
        t.add(bq, x, run, f.w, x - f.child[q], run_self)
        out[q] = x
    return out if want else None


def _record_wall(s: _Slot, f: _Frame, m: _Measure) -> None:
    s.calls += 1
    s.errors += bool(m.error)
    s.abandoned += bool(m.abandoned)
    s.overlapped += bool(m.overlapped)
    s.wall_total += m.wall
    s.wall_self += m.wall - f.child_wall   # not clamped per call: totals add up exactly (as csrc/record.c)
    s.wall_min = min(s.wall_min, m.wall)
    s.wall_max = max(s.wall_max, m.wall)
    i = _hist.index(m.wall)
    s.hist[i] = s.hist.get(i, 0) + 1
    s.susp_total += m.susp
    s.susp_self += m.susp - f.child_susp
    s.loop_total += m.loop
    s.loop_self += m.loop - f.child_loop


def _record(slots: Optional["_ThreadSlots"], f: _Frame, p: Optional[_Frame], m: _Measure) -> None:
    """One finished call of f (p: the frame below it in its stack) into the thread's slots, as csrc/record.c."""
    global _ring_next, _ring_total
    _correct(m)
    s = None
    if slots is not None and f.epoch == _epoch:
        s = slots.stats.get(f.node)
        if s is None:
            s = slots.stats[f.node] = _Slot()
    covered = m.read or m.stand_in
    give = p is not None and p.w > 0 and covered   # a read parent's self needs its children's estimates
    e = None
    if s is not None and s.cpu0 is None:
        s.mark_start(m.wall)   # its first call: it began at most its wall time ago
    if s is not None and covered:
        e = _estimate_call(s, f, m, give)
    if give and e is None:
        e = [max(x or 0.0, 0.0) for x in m.x] if m.read and m.x is not None else None
    if p is not None:
        p.child_wall += m.wall
        p.child_susp += m.susp
        p.child_loop += m.loop
        if e is not None:
            for q, v in enumerate(e[:len(p.child)]):
                p.child[q] += v
    if s is None:
        return
    _record_wall(s, f, m)
    if m.mux is not None and m.read:
        if s.mux is None:
            s.mux = [[0, 0, 0] for _ in _ctr_events]
        for k, (de, dr) in enumerate(m.mux):
            if m.x[Q_CTR + k] is not None:
                s.mux[k][0] += de
                s.mux[k][1] += dr
                s.mux[k][2] += dr != de
    if _ring and not m.abandoned:
        cpu = max(m.x[Q_CPU], 0) if m.read and m.x is not None and m.x[Q_CPU] is not None else -1   # as csrc/record.c
        _ring[_ring_next] = (f.node, slots.native_id, f.r0.t, m.wall, f.r0.q[Q_CPU] if cpu >= 0 else -1, int(cpu))
        _ring_next = (_ring_next + 1) % len(_ring)
        _ring_total += 1


def _abandoned(st: _Stack, f: _Frame) -> _Measure:
    """f, a frame of a stack whose context died, as a call that ended at the context's last task switch."""
    out = st.out
    known = st.suspended and st.clk is not None and st.clk[1] == _epoch and out is not None
    attributable = known and st.taint == f.taint0 and f.slots is st.clk[0]
    m = _Measure((out.t if known else _perf_ns()) - f.r0.t, max(st.s_wall - f.susp0, 0) if known else 0,
                 max(st.s_loop - f.loop0, 0) if known else 0, overlapped=known and not attributable,
                 stand_in=attributable and f.skipped, abandoned=True)
    _tasks["abandoned_calls"] += 1
    if attributable and f.w:
        r1 = out.copy()
        _relative(r1, st)
        _call_quantities(f.r0, r1, m)
        m.inner = r1.tq - f.r0.tq   # what predicts it, as a closed read call's (_read_exit)
        m.read = True
    return m


def _abandon(st: _Stack, frames: List[_Frame], i: int) -> None:
    """frames[i] of a stack whose context died, recorded through the one record path."""
    slots = getattr(_local, "slots", None)   # never made here: this may run during finalisation
    f = frames[i]
    if slots is None or f.epoch != _epoch:
        return
    _record(slots, f, frames[i - 1] if i > 0 else None, _abandoned(st, f))


def _enter(stage: "Stage") -> None:
    global _open
    if not _enabled:
        return
    try:
        slots = _slots()
        st = _stack_current(slots)
        parent = _stack.get()
        f = _Frame()
        f.stage = stage
        f.parent = parent
        f.node = _node_child(parent.node if parent is not None and parent.gen == _node_gen else 0, stage.name)
        f.gen = _node_gen
        f.slots = slots
        f.epoch = _epoch
        f.child_wall = f.child_susp = f.child_loop = 0
        f.hook = None
        f.xm, f.xm_child = None, 0
        f.nvtx, f.w, f.sw0, f.sw_in, f.skipped = 0, 0.0, 0, 0, False
        f.r0 = _Reading(_perf_ns())
        f.taint0 = f.susp0 = f.loop0 = 0
        _stack.set(f)   # before the hook, as in the C backend: current_path() includes this stage
        st.frames.append(f)
        _open += 1
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
        if _xm_k:
            _xm_enter(f, parent)
        f.sw0 = _switch_seq(slots)   # whether the thread leaves the CPU during the call
        w = _budget_read(slots, f.node) if _cpu_clock or _ctr_events else 0.0   # nothing read without a CPU source
        if w:
            if _ctr_events:
                _counters(slots)
            t0 = _perf_ns()   # the wall window holds the reads: a thread preempted in one loses that time in the call
            f.r0 = _read_boundary(slots, False)
            f.sw_in = _switch_seq(slots)
            f.r0.t = t0
            f.w = w
            st.n_read += 1
            f.child = [0.0] * (Q_CTR + len(_ctr_events))
        else:
            f.r0.t = _perf_ns()
            f.skipped = True
        _task_enter(slots, st, f)   # readings relative to this context's task
    except Exception:
        _internal_failure("stage enter")


def _read_exit(slots: "_ThreadSlots", st: _Stack, f: _Frame) -> _Measure:
    """The readings at exit, in the reverse order of enter's, then the wall clock."""
    read = f.w > 0 and f.slots is slots
    sw_in = _switch_seq(slots) if read else 0   # before the reads: between the CPU reads
    r1 = _read_boundary(slots, True) if read else None
    if r1 is not None:
        r1.t = _perf_ns()   # where it serves as the reading a stage around the step resumes at
    m = _Measure(0)
    over = _task_exit(slots, st, f, r1, m)
    m.wall = _perf_ns() - f.r0.t
    m.switched = f.slots is not slots or _switch_seq(slots) != f.sw0
    m.switched_in = sw_in != f.sw_in if read else m.switched
    m.read = read and not over
    if m.read:
        _call_quantities(f.r0, r1, m)
        m.inner = r1.tq - f.r0.tq
    m.overlapped = over
    m.stand_in = f.skipped and f.slots is slots and not over
    return m


STACK_EARLY = 4   # stages closed early per stack whose later exits are expected (as csrc/frame.h)


def _close_top(st: _Stack, error: bool) -> None:
    """Closes the innermost frame of the stack: its readings, its record, its exemplar part, its integrations."""
    global _open
    frames = st.frames
    f = frames[-1]
    _open -= 1
    try:
        slots = _slots()
        m = _read_exit(slots, st, f)
        m.error = error
        del frames[-1]
        if f.w:
            st.n_read -= 1
        _stack.set(f.parent)
        if f.slots is not slots:
            _counts["cross_thread_exits"] += 1
            _warn_once("thread", f"instrument: stage {f.stage.name!r} was exited on another thread than it was "
                       "entered on; its CPU time is not recorded for that call")
        _record(slots, f, frames[-1] if frames else None, m)
        if f.xm is not None and f.xm.open:
            _xm_exit(f, m, slots)
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
        if frames and frames[-1] is f:
            del frames[-1]
        _internal_failure("stage exit")
    if f.parent is None and _root_exit_hook is not None:   # an outermost call is complete
        try:
            _root_exit_hook()
        except Exception:
            _internal_failure("root exit hook")
    if f.parent is None and _probe_hook is not None and _perf_ns() >= _probe_due:
        _probe()


def _probe() -> None:
    """Runs the machine probe; it says in how many ns from its end it is due again (as csrc/rootexit.c
    probe_notify)."""
    global _probe_due
    hook = _probe_hook
    _probe_due = 1 << 63   # not again while it runs
    try:
        wait = operator.index(hook())
    except Exception:
        _internal_failure("machine probe")
        wait = 1_000_000_000
    if hook is _probe_hook:
        _probe_due = _perf_ns() + max(wait, 0)


def _frame_index(st: Optional[_Stack], stage: "Stage") -> int:
    """The innermost open frame of `stage` in the running context's own stack; -1: none."""
    if st is None or not st.frames or not _owns(st):   # only the context that entered a stage can exit it
        return -1
    frames = st.frames
    i = len(frames) - 1
    while i >= 0 and frames[i].stage is not stage:
        i -= 1
    return i


def _exit(stage: "Stage", error: bool) -> None:
    st = _owned.get()
    i = _frame_index(st, stage)
    if i < 0:
        if st is not None and stage in st.early:   # closed early with an outer stage: its exit was expected
            st.early.remove(stage)
            return
        if _enabled:
            _counts["unmatched_exits"] += 1
            _warn_once("unmatched", f"instrument: stage {stage.name!r} exited on a different thread or task than it was "
                       "entered on (or exited twice); that call is not recorded")
        return
    if i != len(st.frames) - 1:   # inner stages still open: they close with this one, so none outlives it
        _counts["out_of_order_exits"] += 1
        _warn_once("order", f"instrument: stage {stage.name!r} exited while an inner stage was still open; the inner "
                   "stages are closed with it (their own exits later are ignored)")
        while i >= 0 and i != len(st.frames) - 1:   # a closing frame's hooks may run Python: looked at again
            st.early = (st.early + [st.frames[-1].stage])[-STACK_EARLY:]
            _close_top(st, error)
            i = _frame_index(st, stage)
        if i < 0:
            return
    _close_top(st, error)


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


def _known_sum(a: int, b: int) -> int:
    return -1 if a < 0 or b < 0 else a + b


def _xm_exit(f: "_Frame", m: "_Measure", slots: "_ThreadSlots") -> None:
    global _xm_calls
    c = f.xm
    parts, wall = c.parts, m.wall
    node = f.node
    if node not in parts and len(parts) >= XM_MAX_PARTS - 1:
        node = -1
    # self time within the call's own context (as the C backend's stack counts it): children in other tasks left out;
    # how it went (as csrc/exemplars.c): on a CPU and in the run queue where read, awaiting and waiting for the loop
    susp, loop = m.susp - f.child_susp, m.loop - f.child_loop
    x = m.x if m.read and m.x is not None else None
    cpu = max(int(x[Q_CPU] - f.child[Q_CPU]), 0) if x is not None and x[Q_CPU] is not None else -1
    rq = max(int(x[Q_RQ] - f.child[Q_RQ]), 0) if x is not None and x[Q_RQ] is not None else -1
    if not m.read and _switches and not m.switched:   # never left the CPU: on it for all its running time
        cpu, rq = max(wall - f.xm_child - susp, 0), 0
    part = [max(wall - f.xm_child, 0), cpu, rq, max(susp - loop, 0), max(loop, 0)]
    old = parts.get(node)
    parts[node] = part if old is None else [old[0] + part[0], _known_sum(old[1], part[1]),
                                            _known_sum(old[2], part[2]), old[3] + part[3], old[4] + part[4]]
    p = f.parent
    if p is not None and p.xm is c:
        p.xm_child += wall
    if c.root != id(f):
        return
    c.open = False
    _xm_calls -= 1
    if f.epoch == _epoch and _xm_k:
        _xm_offer(f.node, c.seq, wall, f.r0.t, slots.native_id, parts)


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
    x = (wall, seq, t0, tid & 0xFFFFFFFF, [(n, *v) for n, v in parts.items()])
    if to_slow:
        (heapq.heappush if len(slow) < k else heapq.heapreplace)(slow, x)
    if len(res) < k:
        res.append(x)
    elif j < k:                     # as the C store: the reservoir never holds more than K calls
        res[j] = x


def _parts_cap(n: int) -> int:
    c = 4
    while c < n:
        c *= 2
    return min(c, XM_MAX_PARTS)


def _xm_bytes() -> tuple:
    """The memory the C backend's layout would hold for the stores, and for the open calls (the figures both
    backends report)."""
    calls = _xm_calls * (32 + 48 * 4)   # sizeof(ExemplarCall) and room for 4 stages
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
        total += 32 + 2 * min(cap, _xm_k) * 48 + sum(48 * _parts_cap(len(x[4])) for x in st.slow + st.res)
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
            s = stats[node] = _Slot()
        it = _item_slot(s.items, str(name))
        it.n += n
        it.x += x
        it.calls += 1
        it.floats += fl
    except Exception:
        _internal_failure("add")



# the asyncio step hooks (live/tasks.py installs them), as csrc/steps.c's Runner
def _inner_of(ctx) -> Optional[_Stack]:
    """The stack the handle's context owns, with stages open."""
    st = ctx.get(_owned)
    if st is None or not st.frames:
        return None
    if st.owner is ctx:
        return st
    if st.owner is None:          # made in this context outside the hook (an eager first step, by hand)?
        try:
            if ctx.run(_owns, st):
                st.owner = ctx    # adopted; it was never suspended, so resuming it marks its open stages
                return st
        except RuntimeError:
            pass
    return None


def _needs_reads(a: Optional[_Stack], b: Optional[_Stack]) -> bool:
    return bool((a is not None and a.n_read) or (b is not None and b.n_read))


def _top_node(st: Optional[_Stack]) -> int:
    return st.frames[-1].node if st is not None and st.frames else 0


def step_runner(run):
    """A stand-in for asyncio.events.Handle._run that charges each task step to its context."""
    if not callable(run):
        raise TypeError(f"step_runner needs the method it stands in for, not {type(run).__name__}")

    def _run(handle):
        if not _enabled:
            return run(handle)
        try:
            ctx = handle._context
            if not isinstance(ctx, contextvars.Context):
                return run(handle)
        except AttributeError:
            return run(handle)
        slots = _slots()
        _tasks["steps"] += 1
        t0 = _perf_ns() if _open else 0
        # when the handle's context has stages open, the stack around the step (the running context's, own or
        # inherited, with its innermost stage on this thread) leaves and the handle's enters at one reading;
        # otherwise the one around keeps running until the step opens a stage (_task_enter)
        outer = _owned.get() if _open else None      # no stage open anywhere: nothing to suspend or resume
        if outer is not None and (not outer.frames or outer.suspended or outer.frames[-1].slots is not slots):
            outer = None
        inner = _inner_of(ctx) if _open else None
        node = _top_node(inner) or _top_node(outer)
        if inner is not None:
            last, full = slots.last, _needs_reads(outer, inner)
            r = (last if slots.chain and slots.batch > 0 and last is not None and last.epoch == _epoch and
                 (last.full or not full) and (not full or not _ctr_events or last.gen == _ctr_gen)
                 else _take_reading(slots, full, False))
            if outer is not None:
                _suspend(slots, outer, r)
            _resume(slots, inner, r)
        slots.chain = False
        prev = (slots.ctx, slots.tok, slots.htok, slots.step_outer, slots.step_ctx, slots.step_handle, slots.step_t0,
                slots.step_node)
        try:
            slots.tok, slots.htok = ctx.run(_marks)   # boundaries in the step compare with its own context
        except RuntimeError:
            slots.tok = slots.htok = None
        slots.ctx = ctx
        slots.step_outer, slots.step_ctx, slots.step_handle, slots.step_t0, slots.step_node = outer, ctx, handle, t0, (0, 0)
        if not slots.batch_t0:
            slots.batch_t0 = t0
        try:
            return run(handle)
        finally:
            inner = _inner_of(ctx) if _open else None
            if inner is not None and inner.suspended:
                inner = None
            t1 = 0
            if inner is not None or (outer is not None and outer.suspended):
                slots.last = r = _take_reading(slots, _needs_reads(inner, outer if outer is not None and
                                                                   outer.suspended else None), True)
                t1 = r.t
                if inner is not None:
                    _suspend(slots, inner, r)
                if outer is not None and outer.suspended:
                    _resume(slots, outer, r)
                slots.chain = True
            else:
                slots.chain = False
            if _open and slots.step_t0:   # the loop's record of who held it, for tasks waiting on it
                _step_span(slots, slots.step_t0, t1 or _perf_ns(), _top_node(inner) or slots.step_node[1] or node)
            (slots.ctx, slots.tok, slots.htok, slots.step_outer, slots.step_ctx, slots.step_handle, slots.step_t0,
             slots.step_node) = prev

    _run.__wrapped__ = run
    return _run


def iteration_runner(run):
    """A stand-in for BaseEventLoop._run_once: readings are never carried across its wait for events."""
    if not callable(run):
        raise TypeError(f"iteration_runner needs the method it stands in for, not {type(run).__name__}")

    def _run_once(loop):
        if not _enabled:
            return run(loop)
        slots = _slots()
        slots.chain = False
        slots.batch += 1
        slots.batch_t0 = 0
        try:
            return run(loop)
        finally:
            slots.batch -= 1
            slots.chain = False
            slots.batch_t0 = 0

    _run_once.__wrapped__ = run
    return _run_once


def _ready_since(slots: "_ThreadSlots") -> int:
    """When what the running step wakes counts as ready (csrc/steps.c ready_since): at the due time of the timer it
    runs, now for a task's own step, else from the start of the loop iteration's steps (a lower bound of the wait);
    now outside any step."""
    now = _perf_ns()
    h = slots.step_handle
    if h is None:
        return now
    if type(h).__name__ == "TimerHandle":
        try:
            return min(int(h._when * 1e9), now)
        except (AttributeError, TypeError, ValueError):
            return now
    if slots.step_ctx is not None and _inner_of(slots.step_ctx) is not None:
        return now
    return slots.batch_t0 if 0 < slots.batch_t0 < now else now


def ready_runner(call_soon):
    """A stand-in for BaseEventLoop._call_soon(callback, args, context): a suspended task whose step is scheduled
    is ready from then on (its wait for the loop is counted)."""
    if not callable(call_soon):
        raise TypeError(f"ready_runner needs the method it stands in for, not {type(call_soon).__name__}")

    def _call_soon(loop, callback, args, context):
        handle = call_soon(loop, callback, args, context)
        if _enabled and _open and isinstance(context, contextvars.Context):
            try:
                st = _inner_of(context)
                if st is not None and st.suspended and not st.ready:
                    st.ready = _ready_since(_slots())
            except Exception:
                _internal_failure("asyncio ready hook")
        return handle

    _call_soon.__wrapped__ = call_soon
    return _call_soon


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


def _opt_flag(name: str):
    def apply(v: Any) -> None:
        globals()[name] = bool(v)
    return apply


def _opt_int(name: str, lo: int, hi: int, apply):
    def check(v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"{name} must be an integer from {lo} to {hi}, got {v!r}")
    return check, apply


def _set_nvtx(v: Any) -> None:
    global _nvtx
    from . import nvtx as nvtx_module
    _nvtx = nvtx_module if v and nvtx_module.backend() != "none" else None


def _set_max_stages(v: int) -> None:
    global _max_nodes
    _max_nodes = int(v)


def _set_trace_events(v: int) -> None:
    global _ring, _ring_next, _ring_total
    if v != len(_ring):
        _ring = [None] * int(v)
        _ring_next = _ring_total = 0


def _set_exemplars(v: int) -> None:
    global _xm_k
    if v != _xm_k:
        _xm_stores.clear()
        _xm_k = int(v)


def _check_budget(v: Any) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1):
        raise ValueError(f"overhead_budget must be None (read every call) or a number from 0 to 1, got {v!r}")


def _set_budget(v: Any) -> None:
    global _budget
    _budget = float(v or 0.0)


def _no_check(v: Any) -> None:
    pass


# the hot-path options (config.py marks them `hot`): name -> (check, apply), as csrc/module.c's table
_OPTIONS = {
    "enabled": (_no_check, _opt_flag("_enabled")),
    "cpu_clock": (_no_check, _opt_flag("_cpu_clock")),
    "cpu_split": (_no_check, _opt_flag("_cpu_split")),
    "nvtx": (_no_check, _set_nvtx),
    "max_stages": _opt_int("max_stages", 1, 10_000_000, _set_max_stages),
    "trace_events": _opt_int("trace_events", 0, 100_000_000, _set_trace_events),
    "exemplars": _opt_int("exemplars", 0, XM_MAX_K, _set_exemplars),
    "overhead_budget": (_check_budget, _set_budget),
    "run_queue": (_no_check, _opt_flag("_run_queue")),
    "helper_cpu": (_no_check, _opt_flag("_helper_cpu")),
}


def configure(**options: Any) -> None:
    """The hot-path options (those config.py marks hot); every value checked before any is applied."""
    for k, v in options.items():
        if k not in _OPTIONS:
            raise TypeError(f"configure() got an unknown option {k!r}; the hot-path options are: {', '.join(_OPTIONS)}")
        _OPTIONS[k][0](v)
    for k, v in options.items():
        _OPTIONS[k][1](v)


def configuration() -> Dict[str, Any]:
    """The hot-path options in force, as configure() takes them."""
    return {"enabled": _enabled, "cpu_clock": _cpu_clock, "cpu_split": _cpu_split, "nvtx": _nvtx is not None,
            "max_stages": _max_nodes, "trace_events": len(_ring), "exemplars": _xm_k,
            "overhead_budget": _budget or None, "run_queue": _run_queue, "helper_cpu": _helper_cpu}


def _time_reads(slots: "_ThreadSlots", n: int) -> int:
    """The reads of one call, as _enter/_exit take them, timed bare: their cost (median), for the budget."""
    costs = []
    for _ in range(n):
        a = _perf_ns()
        _read_boundary(slots, False)
        _read_boundary(slots, True)
        costs.append(_perf_ns() - a)
    return sorted(costs)[n // 2]


def _calibration_stage() -> "Stage":
    cal = Stage("(instrument calibration)")
    with _lock:   # a node outside the cardinality cap: not one of the user's max_stages
        if (0, cal.name) not in _node_ids:
            _node_ids[(0, cal.name)] = len(_nodes)
            _nodes.append((0, cal.name, 0))
    return cal


def _time_bare_calls(cal: "Stage", slots: "_ThreadSlots", n: int) -> tuple:
    """A stage call without reads: ns per enter+exit, and the wall time such a call records."""
    global _ctr_events, _cpu_clock, _cpu_split, _run_queue, _helper_cpu, _wall_bias
    saved = (_ctr_events, _cpu_clock, _cpu_split, _run_queue, _helper_cpu)
    _ctr_events, _cpu_clock, _cpu_split, _run_queue, _helper_cpu, _wall_bias = [], False, False, False, False, [0, 0]
    try:
        times, walls = [], []
        for _ in range(n):
            slots.stats = {}
            a = _perf_ns()
            for _ in range(32):
                _enter(cal)
                _exit(cal, False)
            times.append(_perf_ns() - a)
            walls.append(sum(sl.wall_total for sl in slots.stats.values()) // 32)
        return sorted(times)[n // 2] / 32, sorted(walls)[n // 2]
    finally:
        _ctr_events, _cpu_clock, _cpu_split, _run_queue, _helper_cpu = saved


def _measure_biases(cal: "Stage", slots: "_ThreadSlots", n: int) -> Optional[tuple]:
    """Empty calls read on every call, on the real path: what one records in its CPU window, its wall window and
    between its CPU reads; None when fewer than 5 calls were read."""
    global _cpu_bias, _inner_bias, _wall_bias, _budget
    _cpu_bias, _inner_bias, _wall_bias, _budget = 0, 0, [0, 0], 0.0
    cpus, walls, inner = [], [], []
    for _ in range(n):
        slots.stats = {}
        _enter(cal)
        _exit(cal, False)
        for sl in slots.stats.values():
            walls.append(sl.wall_total)
            if sl.est is not None and sl.est[Q_CPU].reads:
                cpus.append(sum(c[1] for c in sl.est[Q_CPU].tot))
                inner.append(sum(c[2] for c in sl.est[Q_CPU].tot))
    if len(walls) < 5:
        return None
    return ((max(_trimmed_mean(cpus), 0) if cpus else 0), max(_trimmed_mean(walls), 0),
            (max(_trimmed_mean(inner), 0) if inner else 0))


def _trimmed_mean(v: list) -> int:
    """The mean of the middle 80 %: what a call costs on average, without the rare interrupt or fault."""
    v = sorted(v)
    k = len(v) // 10
    mid = v[k:len(v) - k]
    return int(sum(mid) / len(mid))


def _probe_switches(slots: "_ThreadSlots") -> str:
    """Whether the switch page moves when this thread sleeps (as csrc/calibrate.c probe_switches)."""
    global _switches
    _switches = False
    if slots.sw is None:
        return "unavailable (no perf context-switches event for this thread: perf_event_paranoid?)"
    for _ in range(3):
        a = slots.sw.seq()
        time.sleep(50e-6)
        if slots.sw.seq() != a:
            _switches = True
            return "perf mmap page (each call: whether its thread left the CPU)"
    return "unavailable (the kernel does not update the perf mmap page when the thread is switched in)"


def calibrate(n: int = 200) -> Dict[str, Any]:
    """What the configuration in force costs on this thread, the way _enter/_exit spend it (as csrc/calibrate.c):
    one call's reads (the budget's unit), what an empty call records in its wall window (read or not) and in its
    CPU window (taken out of every call), and a stage call without reads (None while a stage is open here)."""
    global _read_cost, _cpu_bias, _inner_bias, _wall_bias, _enabled, _nvtx, _xm_k, _ring, _budget, _probe_hook
    global _hook_enter, _hook_exit, _root_exit_hook
    if not 1 <= n <= 1_000_000:
        raise ValueError(f"calibrate needs 1 to 1000000 rounds, got {n}")
    n = max(n, 9)
    slots = _slots()
    if _ctr_events:
        _counters(slots)
    switches = _probe_switches(slots)
    probe = _read_boundary(slots, False)
    src = probe.cpu_src
    reads = bool(src or probe.gen or probe.q[Q_RQ] >= 0 or probe.q[Q_HELPERS] >= 0)
    read_ns = _time_reads(slots, n) if reads else 0
    _read_cost = float(read_ns)
    base = None
    if _stack.get() is None:
        saved = (_enabled, _nvtx, _xm_k, _ring, _hook_enter, _hook_exit, _root_exit_hook, _probe_hook, slots.stats,
                 _budget, _cpu_bias, _inner_bias, _wall_bias)
        _enabled, _nvtx, _xm_k, _ring = True, None, 0, []
        _hook_enter = _hook_exit = _root_exit_hook = _probe_hook = None
        biases = None
        try:
            cal = _calibration_stage()
            base, bare_wall = _time_bare_calls(cal, slots, n)
            if reads:
                biases = _measure_biases(cal, slots, n)
        finally:
            (_enabled, _nvtx, _xm_k, _ring, _hook_enter, _hook_exit, _root_exit_hook, _probe_hook, slots.stats,
             _budget, _cpu_bias, _inner_bias, _wall_bias) = saved
        _wall_bias = [bare_wall, _wall_bias[1]]
        if biases is not None:
            _cpu_bias, _inner_bias = int(biases[0]), int(biases[2])
            _wall_bias = [bare_wall, biases[1]]
    return {"read_ns": float(read_ns), "base_ns": base, "cpu_bias_ns": _cpu_bias, "inner_bias_ns": _inner_bias,
            "wall_bias_ns": _wall_bias[1],
            "unread_wall_bias_ns": _wall_bias[0], "cpu_source": ("none", "thread-clock", "task-clock")[src],
            "sys": probe.q[Q_SYS] >= 0, "thread_clock": "clock_gettime (the pure-Python backend)",
            "switches": switches,
            "run_queue": _run_queue_source(),
            "helper_cpu": ("off (the helper_cpu option)" if not _helper_cpu else
                           "process CPU clock less the threads that run stages" if probe.q[Q_HELPERS] >= 0 else
                           f"unavailable (more than {HELPERS_MAX_THREADS} threads run stages)")}


def set_counters(events, exclude_kernel, taskclock_index) -> None:
    global _ctr_events, _ctr_excl, _ctr_taskclock, _ctr_gen, _ctr_first
    events = [(int(t), int(c)) for t, c in events]
    if len(events) > 16:
        raise ValueError(f"at most 16 counters can be read per stage, got {len(events)}")
    with _lock:
        for src in [_retired] + [t.stats for t in _live_threads()]:
            for slot in src.values():
                slot.mux = None      # counter slots of the old events would be misread under the new ones
                if slot.est is not None:
                    del slot.est[Q_CTR:]
                    for _ in events:   # the calls left unread so far are none of the new events'
                        e = _Est()
                        for b in range(STRATA):
                            e.tot[b][UN] = e.own[b][UN] = -slot.un[b]
                            e.tot[b][UW], e.own[b][UW] = -slot.uw[b], -slot.uws[b]
                        slot.est.append(e)
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


def set_probe_hook(hook) -> None:
    global _probe_hook, _probe_due
    if hook is not None and not callable(hook):
        raise TypeError(f"set_probe_hook needs a callable or None, not {type(hook).__name__}")
    _probe_hook, _probe_due = hook, 0


def _estimate_row(s: _Slot, q: int) -> Optional[Dict[str, Any]]:
    e = s.est[q] if s.est is not None and q < len(s.est) else None
    if e is None or not e.reads:
        return None
    total, own, var, var_self = s.estimate(q)
    return {"total": total, "self": own, "var": var, "var_self": var_self, "reads": e.reads}


def _row(nid: int, s: _Slot) -> Dict[str, Any]:
    """One collect() stats row (a _StatsRow in instrument/_native.pyi)."""
    row: Dict[str, Any] = {k: getattr(s, k) for k in _SUMS}
    counters = []
    for k in range(len(_ctr_events)):
        e = _estimate_row(s, Q_CTR + k)
        if e is not None and s.mux is not None and k < len(s.mux):
            e.update(enabled=s.mux[k][0], running=s.mux[k][1], scaled=s.mux[k][2])
        counters.append(e)
    row.update(node=nid, wall_min=s.wall_min, wall_max=s.wall_max, hist=sorted(s.hist.items()),
               cpu_bound=s.cpu_bound,
               estimates={name: _estimate_row(s, q) for q, name in enumerate(SCALAR_NAMES)},
               counters=counters, blockers=sorted(s.blockers.items()),
               items=[(k, v.n, v.x, v.calls, v.floats) for k, v in s.items.items()])
    return row


def collect() -> Dict[str, Any]:
    with _lock:
        merged: Dict[int, _Slot] = {}
        me = getattr(_local, "slots", None)
        sources = [(_retired, -1)] + [(t.stats, time.thread_time_ns() if t is me else _clock_ns(t.cpu_clock_id, math.inf))
                                      for t in _live_threads()]
        for src, cpu_now in sources:   # each thread's CPU clock now: its slots' calls took no more
            for nid, s in list(src.items()):
                _merge_slot(merged.setdefault(nid, _Slot()), s, cpu_now)
        nodes = [(i, p, n, o) for i, (p, n, o) in enumerate(_nodes) if i > 0]
        threads = len(_threads)
    stats = [_row(nid, s) for nid, s in sorted(merged.items()) if s.calls or s.items]
    n = min(_ring_total, len(_ring))
    start = 0 if _ring_total < len(_ring) else _ring_next
    events = [_ring[(start + k) % len(_ring)] for k in range(n)]
    res = dict(counter_errno=[None] * len(_ctr_events) if _ctr_first is None else list(_ctr_first["errno"]))
    if _ctr_first is not None:
        res["counter_open"] = {"exclude_kernel": _ctr_first["exclude_kernel"], "rdpmc": False}
    return dict(res, nodes=nodes, stats=stats, events=events, events_dropped=_ring_total - n, max_stages=_max_nodes,
                threads=threads, clock_ns=_perf_ns(), tasks=dict(_tasks), exemplars=_xm_collect(),
                exemplar_bytes=_xm_bytes(), **_counts)


def _zero() -> None:
    global _ring_next, _ring_total
    with _lock:
        for t in _live_threads():
            t.stats.clear()
        _retired.clear()
        for k in _counts:
            _counts[k] = 0
        for k in _tasks:
            _tasks[k] = 0
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
    global _epoch, _lock, _ctr_first, _probe_due
    _lock = threading.RLock()
    _probe_due = 0   # a fork while another thread ran the probe would leave it never due
    _zero()
    mine = getattr(_local, "slots", None)
    if mine is not None:
        mine.native_id = threading.get_native_id()
    for t in _live_threads():
        if t.perf is not None:
            t.perf.close()     # the inherited fds count the parent's threads
        t.perf, t.perf_gen = None, 0
        if t.sw is not None:
            t.sw.close()
        t.sw = _switch_page() if t is mine else None
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
