"""The live side's centre: applies the configuration to the backend, turns what
the backend and the integrations collected into a Snapshot, and saves at exit."""
from __future__ import annotations

import atexit
import functools
import inspect
import math
import os
import platform
import socket
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

from .. import config as _config
from .. import counters
from .._version import __version__
from ..snapshot import Snapshot, StageStats, path_text
from ..snapshot.base import uncounted
from . import backend as _backend
from . import callsite, integrations, memory, nvtx, perf, probe

backend = _backend.current   # the hot path reads this global; _on_backend_switch keeps it current

_state_lock = threading.Lock()
_config_now: _config.Config = _config.from_env()
_start_wall = time.time()
_start_clock = backend.now_ns()
judge: Optional[Callable[[Snapshot], Snapshot]] = None   # set by the facade: adds verdicts (instrument.analysis)


def current_config() -> _config.Config:
    return _config_now


_configure_listeners: List[Callable[[_config.Config, Dict[str, Any]], None]] = []


def on_configure(listener: Callable[[_config.Config, Dict[str, Any]], None]) -> None:
    """`listener(config, options)` after every configure() (the facade starts the `serve` server)."""
    _configure_listeners.append(listener)


def configure(**options: Any) -> _config.Config:
    """Change options (see instrument.config.OPTIONS); returns the configuration now in force."""
    global _config_now
    with _state_lock:
        new = _config_now.replace(**options)
        _apply(new, explicit_counters="counters" in options)
        _config_now = new
    for listener in _configure_listeners:
        listener(new, options)
    return new


def _apply(cfg: _config.Config, explicit_counters: bool = False) -> None:
    if cfg.nvtx:
        nvtx.init(cfg.nvtx_domain)
    backend.configure(**_config.hot_values(cfg))
    try:   # its sources are read with the CPU time: before the reads' cost is calibrated
        memory.apply(cfg)
    except Exception as e:   # memory must never stop the configuration (nor the import)
        callsite.warn(f"instrument: memory: {e}")
    backend.set_probe_hook(probe.hook(backend) if cfg.machine_probe else None)
    _apply_counters(cfg.counters, explicit_counters)
    _calibrate()
    for integ in integrations.registered():
        try:
            integrations.call(integ, "configure", cfg)
        except Exception as e:  # an integration must never stop the configuration
            callsite.warn(f"instrument: {integ.name}: {e}")


def use_backend(module) -> None:
    """Switch the hot path to `module` (the C extension or the pure-Python fallback) and apply the configuration to it."""
    _backend.use(module)


def _on_backend_switch(module) -> None:
    global backend, _calibration
    _calibration = {}   # the other backend's costs are not this one's
    backend.set_probe_hook(None)
    if _root_exit is not None:
        backend.set_root_exit_hook(None)
        module.set_root_exit_hook(_root_exit)
    backend = module
    module.set_decorator(_decorate)
    _styled.clear()   # styled stages of the other backend record into it
    _applied_counters.pop(module.__name__, None)
    _apply(_config_now)


_root_exit: Optional[Callable[[], None]] = None
_backend.on_switch(_on_backend_switch)


def on_root_exit(callback: Optional[Callable[[], None]]) -> None:
    """`callback()` after every outermost stage exit, once that call is recorded (None: no call;
    the hot path then makes none).  The snapshot writer of worker processes uses it."""
    global _root_exit
    if callback is not None and not callable(callback):
        raise TypeError(f"on_root_exit needs a function or None, not {type(callback).__name__}")
    _root_exit = callback
    backend.set_root_exit_hook(callback)
_counter_names: tuple = ()
_applied_counters: Dict[str, tuple] = {}   # backend module -> the events it was given
_counter_probe: Optional[Dict[str, Any]] = None


def _apply_counters(names: tuple, explicit: bool = False) -> None:
    """Give the backend the events and probe them once, for meta and doctor.
    Events asked for by name (configure or the environment) that cannot be
    opened are warned about once; the default set stays quiet on machines
    without them (a VM without a PMU is normal) and says so in meta."""
    global _counter_names, _counter_probe
    if _applied_counters.get(backend.__name__) == tuple(names):
        return
    specs = [counters.resolve(n) for n in names]
    tc = list(names).index("task-clock") if "task-clock" in names else -1
    backend.set_counters([(t, c) for t, c, _ in specs], False, tc)   # kernel counted where allowed, as perf does
    _forget_held()   # the counters' sums start again
    _applied_counters[backend.__name__] = _counter_names = tuple(names)
    _counter_probe = None
    if names:
        try:
            _counter_probe = perf.probe(list(names))
        except Exception as e:   # probing must never stop the service
            _counter_probe = {"error": str(e), "events": {}}
        bad = {n: v for n, v in _counter_probe.get("events", {}).items() if not v.get("available")}
        if bad and (explicit or _config.set_in_env("counters")):
            first = next(iter(bad.values()))
            key = tuple(sorted(bad))
            if key not in _warned_counters:
                _warned_counters.add(key)
                callsite.warn(f"instrument: perf counters unavailable: {', '.join(bad)} ({first['reason']}"
                              f"{'; fix: ' + first['fix'] if first.get('fix') else ''}); stages are timed without "
                              "them (instrument doctor tells more)")


_warned_counters: set = set()
_calibration: Dict[str, Any] = {}


def calibration() -> Dict[str, Any]:
    """What calibrate() measured for the configuration in force (doctor, meta.overhead)."""
    return dict(_calibration)


def _calibrate() -> None:
    """Measures what the configuration in force costs (the budget's read cost, the reads' bias on CPU time,
    meta.overhead); a stage call's cost is kept from an earlier calibration when a stage is open here now."""
    global _calibration
    try:
        c = backend.calibrate()
    except Exception as e:   # never stops the configuration: stages are then read on every call
        callsite.warn(f"instrument: calibration failed ({e}); counters and CPU time are read on every call")
        return
    if c.get("base_ns") is None:
        c["base_ns"] = _calibration.get("base_ns")
    _calibration = c


REFERENCE_ITERATIONS = 2_000   # one timing of the machine's reference loop (~0.1-0.3 ms)
REFERENCE_REPEATS = 15


def _machine_reference() -> Dict[str, Any]:
    """The machine's speed when recording starts (meta.machine): a fixed pure-Python loop timed on this thread's
    CPU clock, REFERENCE_REPEATS times; its ns per iteration, the share of its wall time it had a CPU, the CPUs
    this process may use.  Two snapshots whose loops ran at different speeds ran on machines of different speed."""
    per, on_cpu = [], []
    for _ in range(REFERENCE_REPEATS):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        probe.loop(REFERENCE_ITERATIONS)
        c, w = time.thread_time_ns() - c0, time.perf_counter_ns() - w0
        per.append(c / REFERENCE_ITERATIONS)
        on_cpu.append(min(1.0, c / w) if w else 1.0)
    per.sort()
    return {"reference_ns": round(per[len(per) // 2], 2), "reference_range_ns": [round(per[0], 2), round(per[-1], 2)],
            "reference_on_cpu": round(sorted(on_cpu)[len(on_cpu) // 2], 3), "measured_at": time.time(),
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


def _machine() -> Dict[str, Any]:
    """meta.machine: the reference measured at import, the probe's through the recording, and the load average at
    the snapshot."""
    return dict(_reference, probe=probe.summary(),
                load=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None)


_styled: Dict[tuple, Any] = {}


def stage(name: str, color: Optional[int] = None, category: Optional[str] = None):
    """The stage named `name`: one object per name, reusable, a context manager.
    color (0xRRGGBB) and category (a name) style its NVTX range; by default the
    colour is derived from the name, the same in every run."""
    if color is None and category is None:
        return backend.stage(name)
    key = (name, color, category)
    s = _styled.get(key)
    if s is None:
        cat = 0
        if category is not None:
            cat = nvtx.category_id(category)
        s = _styled[key] = backend.Stage(name, color, category=cat)
    return s


def _wrap(func: Callable, st) -> Callable:
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def run_async(*args, **kwargs):
            with st:
                return await func(*args, **kwargs)
        run_async.stage = st  # type: ignore[attr-defined]
        return run_async
    if inspect.isasyncgenfunction(func):
        raise TypeError(f"@instrument.region cannot wrap the async generator function {func.__qualname__}: a stage "
                        "cannot stay open across its yields; put `with instrument.stage(...)` around the work "
                        "between yields instead")
    if inspect.isgeneratorfunction(func):
        @functools.wraps(func)
        def run_gen(*args, **kwargs):
            return _TimedGenerator(func(*args, **kwargs), st)
        run_gen.stage = st  # type: ignore[attr-defined]
        return run_gen
    r = backend.Region(st, func)
    try:
        functools.update_wrapper(r, func)
    except (AttributeError, TypeError):
        pass
    return r


class _TimedGenerator:
    """A generator whose every resumption (next/send/throw) runs inside the
    stage; the time the consumer spends between items is not counted."""
    __slots__ = ("_gen", "_stage")

    def __init__(self, gen, st) -> None:
        self._gen, self._stage = gen, st

    def __iter__(self):
        return self

    def __next__(self):
        with self._stage:
            return next(self._gen)

    def send(self, value):
        with self._stage:
            return self._gen.send(value)

    def throw(self, *args):
        with self._stage:
            return self._gen.throw(*args)

    def close(self):
        with self._stage:
            return self._gen.close()

    def __del__(self):
        try:
            self._gen.close()
        except Exception:
            pass


def _decorate(st, func: Callable) -> Callable:
    """`@instrument.stage("x")` on a function: the same wrapping as `@instrument.region("x")`."""
    if not callable(func):
        raise TypeError(f"@instrument.stage({st.name!r}) decorates a function, not {type(func).__name__}; "
                        "use `with instrument.stage(...)` around a block")
    return _wrap(func, st)


backend.set_decorator(_decorate)


def region(name_or_func: Any = None, *, name: Optional[str] = None):
    """Decorator: `@region`, `@region("name")` or `@region(name="name")`.
    The name defaults to the function's __qualname__.  Plain and async functions
    are timed per call; a generator function is timed per resumption (its
    consumer's time between items is not counted); async generator functions
    are refused with TypeError."""
    if callable(name_or_func) and name is None:
        func = name_or_func
        return _wrap(func, backend.stage(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))))
    if name_or_func is not None and name is not None:
        raise TypeError("region() takes the name once: region('name') or region(name='name')")
    label = name if name is not None else name_or_func
    if label is not None:
        st = backend.stage(label)   # validates the name now, at decoration time

    def deco(func: Callable):
        if not callable(func):
            raise TypeError(f"@region needs a function, not {type(func).__name__}")
        s = st if label is not None else backend.stage(func.__qualname__)
        return _wrap(func, s)
    return deco


def reset() -> None:
    """Forget everything recorded so far (stage objects stay valid)."""
    global _start_wall, _start_clock
    backend.reset()
    probe.reset()
    _forget_held()
    for integ in integrations.registered():
        try:
            integrations.call(integ, "reset")
        except Exception:
            pass
    _start_wall, _start_clock = time.time(), backend.now_ns()


def _meta(raw: Dict[str, Any]) -> Dict[str, Any]:
    torch = sys.modules.get("torch")
    meta: Dict[str, Any] = {
        "pid": os.getpid(), "host": socket.gethostname(), "argv": list(sys.argv),
        "start_time": _start_wall, "end_time": time.time(),
        "duration_ns": raw["clock_ns"] - _start_clock,
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": getattr(torch, "__version__", None) if torch else None,
        "instrument": __version__, "backend": _backend.describe(),
        "config": _config_now.to_dict(), "verdict_thresholds": _config.verdict_thresholds(_config_now),
        "threads_live": raw.get("threads"),
        "exits": {k: raw.get(k, 0) for k in ("unmatched_exits", "out_of_order_exits", "cross_thread_exits")},
        "internal_failures": raw.get("internal_failures", 0),
        "folded_calls": raw.get("folded_calls", 0), "max_stages": raw.get("max_stages"),
        "events_dropped": raw.get("events_dropped", 0),
        "exemplars": dict(zip(("k", "bytes", "call_bytes"), (_config_now.exemplars, *raw.get("exemplar_bytes", (0, 0))))),
        "counters": _counter_meta(raw),
        "nvtx": {"emitter": nvtx.backend(), "domain": _config_now.nvtx_domain if _config_now.nvtx else None},
        "machine": _machine(),
    }
    overhead = _overhead(raw)
    if overhead is not None:
        meta["overhead"] = overhead
    meta["gil_wait"] = _backend.current.gil_status()
    for integ in integrations.registered():
        try:
            st = integrations.call(integ, "status", raw)
        except Exception as e:
            st = {"error": str(e)}
        if st is not None:
            meta[integ.name] = st
    return meta


def _counter_meta(raw: Dict[str, Any]) -> Dict[str, Any]:
    events: Dict[str, Any] = {}
    probed = (_counter_probe or {}).get("events", {})
    for name, err in zip(_counter_names, raw.get("counter_errno") or [None] * len(_counter_names)):
        if err is None:
            events[name] = dict(probed.get(name, {"available": None, "reason": "not opened yet"}))
        else:
            reason, fix = counters.describe_errno(err, counters.resolve(name)[2])
            events[name] = {"available": err == 0, "errno": err or None, "reason": reason, "fix": fix}
    opened = raw.get("counter_open") or {}
    return {"events": events, "exclude_kernel": opened.get("exclude_kernel", (_counter_probe or {}).get("exclude_kernel")),
            "read": "rdpmc" if opened.get("rdpmc") else "read()" if events else None}


def _counter_dict(names, rows, covered: int, bound: float = math.inf) -> Dict[str, Dict[str, Any]]:
    """counted_calls: the calls the estimate stands for; read_calls: those read (fewer under the overhead budget).
    task-clock is the stages' CPU time: held to the bound CPU time is held to (_cpu_fields)."""
    out = {}
    for name, row in zip(names, rows):
        if row is None:
            out[name] = uncounted()
            continue
        est = row["reads"] != covered
        enabled, running = row["enabled"], row["running"]
        total = min(max(row["total"], 0.0), bound) if name == "task-clock" else max(row["total"], 0.0)
        out[name] = {"total": total, "self": row["self"], "counted_calls": covered,
                     "read_calls": row["reads"], "estimated": est, "var": row["var"], "var_self": row["var_self"],
                     "scaled": bool(row["scaled"]), "enabled_ns": enabled, "running_ns": running,
                     "running_fraction": running / enabled if enabled else None}
    return out


def _estimate(row: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    return None if row is None else {k: row[k] for k in ("total", "self", "var", "var_self", "reads")}


def _cpu_fields(s: Dict[str, Any]) -> Dict[str, Any]:
    """CPU time and what is read with it (system time, switches, run queue, helpers), from a collect() stats row:
    estimates over the covered calls, exact where every covered call was read."""
    est, covered = s["estimates"], s["covered"]
    cpu = est["cpu"]
    out: Dict[str, Any] = {"covered_run": s["cov_run"], "covered_run_self": s["cov_run_self"],
                           "runqueue": _estimate(est["runqueue"]), "helpers": _estimate(est["helpers"]),
                           "switches": {k: _estimate(est[q]) for k, q in (("voluntary", "vcsw"), ("involuntary", "ivcsw"))
                                        if est[q] is not None}}
    if cpu is None:
        return dict(out, cpu_total=None, cpu_self=None, cpu_calls=0)
    # single calls are not clamped (their corrections are medians): the totals are bounded here, by the running
    # time of the calls they cover; a sampled estimate, which may stray above it, also by their threads' CPU
    # clocks since their first calls (another clock than task-clock: not held to it when every call was read)
    total = min(max(round(cpu["total"]), 0), s["cov_run"])
    if cpu["reads"] != covered:
        total = min(total, s["cpu_bound"])
    self_ = min(round(cpu["self"]), max(s["cov_run_self"], 0))
    out.update(cpu_total=total, cpu_self=self_, cpu_calls=covered, cpu_var=cpu["var"], cpu_var_self=cpu["var_self"],
               cpu_read_calls=cpu["reads"] if cpu["reads"] != covered else None)
    off, gil = est.get("off_samples"), est.get("gil_samples")
    if off is not None and gil is not None and off["reads"]:   # the GIL sampler's samples of the calls (gil.h)
        out["gil_samples"] = {"gil": max(gil["self"], 0.0), "blocked": max(off["self"], 0.0),
                              "gil_total": max(gil["total"], 0.0), "blocked_total": max(off["total"], 0.0)}
    if est["sys"] is not None:
        out["cpu_sys_total"] = int(min(max(est["sys"]["total"], 0), total))
        out["cpu_sys_self"] = int(min(max(est["sys"]["self"], 0), max(self_, 0)))
    return out


_held: Dict[tuple, Dict[str, Any]] = {}
_held_lock = threading.RLock()   # a signal's save may run inside a snapshot on the same thread
_save_lock = threading.RLock()   # and inside a save


def _with_instrument_cost(stages: List[StageStats], overhead: Optional[Dict[str, Any]]) -> List[StageStats]:
    """Each stage with instrument's own cost inside its running time: what its child stages' calls cost at their
    boundaries, whole (a read call the calibrated cost of a read, an unread one that of a bare call: the
    children's own figures have theirs taken out), and below it in all."""
    if not overhead or overhead.get("per_read_calibrated_ns") is None:
        return stages
    read, bare = overhead["per_read_calibrated_ns"], overhead["per_call_ns"]
    own: Dict[tuple, float] = {}
    for st in stages:
        if len(st.path) > 1 and st.calls:
            reads = min(st.cpu_reads, st.calls)
            own[st.path[:-1]] = own.get(st.path[:-1], 0.0) + reads * read + (st.calls - reads) * bare
    total: Dict[tuple, float] = {}
    for path, ns in own.items():   # every ancestor's total holds it
        for k in range(1, len(path) + 1):
            total[path[:k]] = total.get(path[:k], 0.0) + ns
    return [st.evolve(instrument_self=int(own.get(st.path, 0)), instrument_total=int(total.get(st.path, 0)))
            if st.path in total else st for st in stages]


def _hold(stages: List[StageStats]) -> List[StageStats]:
    """Estimated totals never go down from one snapshot to the next in this process: a new read can lower a
    ratio estimate a little, and a Prometheus counter that goes down reads as a reset.  Each estimated total
    keeps its highest value until reset(), a fork or a change of the counters forgets them."""
    out = []
    with _held_lock:
        for st in stages:
            h = _held.setdefault(st.path, {"cpu": None, "sys": None, "ctr": {}})
            fields: Dict[str, Any] = {}
            if st.cpu_read_calls is not None and st.cpu_total is not None:
                # system and user time each held, CPU time their sum: all three never go down
                sys_now = st.cpu_sys_total
                if sys_now is not None and h["sys"] is not None:
                    user = max(st.cpu_total - sys_now, h["cpu"] - h["sys"] if h["cpu"] is not None else 0)
                    sys_now = max(sys_now, h["sys"])
                    if sys_now + user != st.cpu_total:
                        fields.update(cpu_total=sys_now + user, cpu_sys_total=sys_now)
                elif h["cpu"] is not None and st.cpu_total < h["cpu"]:
                    fields["cpu_total"] = h["cpu"]
            elif st.cpu_total is not None and st.cpu_sys_total is not None and h["cpu"] is not None \
                    and h["sys"] is not None and st.cpu_total >= h["cpu"]:
                # every call read: CPU time is an exact sum and stays; a call's system time from rusage may pass its
                # CPU time (the kernel's tick-sampled split), so user and system time are each kept from going down
                user = max(st.cpu_total - st.cpu_sys_total, h["cpu"] - h["sys"])
                sys_now = max(st.cpu_total - user, h["sys"])
                if sys_now != st.cpu_sys_total:
                    fields["cpu_sys_total"] = sys_now
            h["cpu"] = fields.get("cpu_total", st.cpu_total)
            h["sys"] = fields.get("cpu_sys_total", st.cpu_sys_total)
            ctr = {}
            for name, c in st.counters.items():
                total, prev = c.get("total"), h["ctr"].get(name)
                if total is not None and c.get("estimated") and prev is not None and total < prev:
                    ctr[name] = dict(c, total=prev)
                h["ctr"][name] = prev if name in ctr else total
            if ctr:
                fields["counters"] = dict(st.counters, **ctr)
            _hold_split(h, st, fields)
            out.append(st.evolve(**fields) if fields else st)
    return out


def _hold_split(h: Dict[str, Any], st: StageStats, fields: Dict[str, Any]) -> None:
    """The estimated parts of the stage's own running time (on a CPU, run queue, GIL wait, blocked: the rest) never
    go down either: each kept at least at its last value, the growth of the covered time shared among those that
    grew.  The GIL wait is the blocked time times the share of the GIL sampler's samples of it that found the GIL.
    Of the totals, the run-queue time is held to the running time the CPU time leaves (the CPU time is held to the
    threads' clocks; both are estimates where calls went unread, and their sum could pass the running time), and
    never goes down either."""
    rq, n = st.runqueue, st.gil_samples
    if st.cpu_self is None or rq is None:
        return
    left = max(st.covered_run - max(fields.get("cpu_total", st.cpu_total) or 0, 0), 0)
    queued_total = max(min(rq["total"], left), h.get("rq_total", 0))
    h["rq_total"] = queued_total
    rq = dict(rq, total=queued_total)
    if n is not None:   # the GIL wait: of the blocked time, the share of its samples that found the GIL; held as the
        off = max(left - queued_total, 0)   # run-queue time is, never lowered when a later CPU estimate shrinks off
        h["gil_total"] = max(off * _share(n["gil_total"], n["blocked_total"]), h.get("gil_total", 0))
        fields["gil_total"] = math.floor(h["gil_total"])
    cov = max(st.covered_run_self, 0)
    cpu = max(fields.get("cpu_self", st.cpu_self), 0)
    sdk = min(max(st.instrument_self, 0), cpu)   # instrument's own cost, on a CPU: a part of its own
    parts = [cpu - sdk, sdk, max(rq["self"], 0)]
    if sum(parts) > cov:
        parts = [p * cov / sum(parts) for p in parts]
    parts.append((cov - sum(parts)) * _share(n["gil"], n["blocked"]) if n is not None else 0.0)
    parts.append(cov - sum(parts))
    floors = h.get("split")
    if floors is not None:
        parts = [max(p, f) for p, f in zip(parts, floors)]
        over, room = sum(parts) - cov, sum(p - f for p, f in zip(parts, floors))
        if over > 0 and room > 0:
            parts = [p - (p - f) * min(over / room, 1) for p, f in zip(parts, floors)]
    user, sdk, queued, gil = (math.floor(p) for p in parts[:4])   # whole ns, never below their last (whole) values
    h["split"] = [user, sdk, queued, gil, cov - user - sdk - queued - gil]   # blocked gets what they leave: at least
    fields["cpu_self"] = user + sdk                                          # its own
    fields["instrument_self"] = sdk
    fields["runqueue"] = dict(rq, self=queued)
    if n is not None:
        fields["gil_self"] = gil


def _share(part: float, whole: float) -> float:
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else 0.0


def _forget_held() -> None:
    with _held_lock:
        _held.clear()


def _overhead(raw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The SDK's own estimated cost: calls x a stage call's cost (calibrate()) + read calls x one call's reads (what
    the run's read calls spent in the SDK beyond their wall windows, else calibrate()'s figure)."""
    c = _calibration
    if not c or c.get("base_ns") is None:
        return None
    calls = reads = 0
    for s in raw["stats"]:
        calls += s["calls"]
        reads += max([0] + [e["reads"] for e in list(s["estimates"].values()) + s["counters"] if e is not None])
    timed = raw.get("read_cost_calls") or 0   # the run's own read calls timed: what a read costs the thread now
    base, read = round(c["base_ns"], 1), round(raw["read_cost_ns"] if timed else c["read_ns"], 1)
    probe_cpu = probe.cpu_ns() if _config_now.machine_probe else None   # on the stages' threads, outside stages
    helpers = c.get("helper_cpu")
    if raw.get("helpers_over_cap"):   # calls that ran while too many threads ran no stage: not read, estimated
        helpers = (f"{helpers}; not read on the calls that ran while more than {backend.HELPERS_MAX} threads ran no "
                   f"stage (up to {raw['helpers_over_cap']} were seen): their helper CPU is estimated from the calls read")
    return {"per_call_ns": base, "per_read_ns": read, "per_read_timed_calls": timed,
            "per_read_calibrated_ns": round(c["read_ns"], 1), "calls": calls,
            "read_calls": reads, "estimated_ns": round(calls * base + reads * read + (probe_cpu or 0)),
            "probe_cpu_ns": probe_cpu,
            "budget": _config_now.overhead_budget, **{k: c.get(k) for k in (
                "cpu_source", "cpu_bias_ns", "inner_bias_ns", "wall_bias_ns", "unread_wall_bias_ns", "sys", "thread_clock",
                "switches", "run_queue")}, "helper_cpu": helpers}


def snapshot(judged: bool = True) -> Snapshot:
    """An immutable Snapshot of everything recorded so far; callable any time.
    judged=False leaves out what the facade adds (verdicts): the snapshot writer's copy."""
    for integ in integrations.registered():
        try:
            integrations.call(integ, "before_snapshot")
        except Exception as e:
            callsite.warn(f"instrument: {integ.name}: {e}")
    raw = backend.collect()
    paths: Dict[int, tuple] = {}
    for nid, parent, name, _other in raw["nodes"]:
        paths[nid] = (paths[parent] if parent > 0 else ()) + (name,)
    others = {nid for nid, _, _, o in raw["nodes"] if o}
    extra: Dict[tuple, Dict[str, Any]] = {}
    for integ in integrations.registered():
        try:
            for path, fields in (integrations.call(integ, "stage_fields") or {}).items():
                extra.setdefault(tuple(path), {}).update(fields)
        except Exception as e:
            callsite.warn(f"instrument: {integ.name}: {e}")
    stages = []
    outside: Dict[str, Dict[str, Any]] = {}
    for s in raw["stats"]:
        if s["node"] == 0:   # items added while no stage was open
            outside = _items(s.get("items"))
            continue
        path = paths[s["node"]]
        stages.append(StageStats(
            path=path, calls=s["calls"], errors=s["errors"], wall_total=s["wall_total"], wall_self=max(s["wall_self"], 0),
            wall_min=s["wall_min"] if s["calls"] else None, wall_max=s["wall_max"] if s["calls"] else None,
            hist=dict(s["hist"]), **_cpu_fields(s),
            counters=_counter_dict(_counter_names, s["counters"], s["covered"], s["cov_run"]),
            loop_total=s["loop_total"], loop_self=s["loop_self"],
            loop_blockers={_blocker_path(paths, n): held for n, held, _ in s["blockers"]},
            loop_blockers_waited={_blocker_path(paths, n): waited for n, _, waited in s["blockers"]},
            other=s["node"] in others, overlapped_calls=s["overlapped"], abandoned_calls=s["abandoned"],
            suspended_total=s["susp_total"], suspended_self=s["susp_self"], items=_items(s.get("items")),
            memory=s.get("memory") or None, **extra.pop(path, {})))
    meta = _meta(raw)
    stages = _hold(_with_instrument_cost(stages, meta.get("overhead")))
    for path, fields in extra.items():   # stages only an integration saw (e.g. GPU time of a still-open stage)
        stages.append(replace(StageStats.empty(path), **fields))
    events = [{"path": list(paths[e[0]]), "tid": e[1], "ts_ns": e[2] - _start_clock, "dur_ns": e[3],
               "tts_ns": e[4] if e[4] >= 0 else None, "tdur_ns": e[5] if e[5] >= 0 else None}
              for e in raw["events"] if e[0] in paths]
    if outside:
        meta["items_outside_stages"] = outside
    snap = Snapshot(stages, meta, events, _exemplars(raw.get("exemplars") or (), paths, meta["pid"]))
    return judge(snap) if judge is not None and judged else snap


def _blocker_path(paths: Dict[int, tuple], node: int) -> str:
    return path_text(paths[node]) if node in paths else "(other)"   # node -1: the rest of a full list


def _items(rows) -> Dict[str, Dict[str, Any]]:
    """(name, int total, float total, adds, float adds) rows as {name: {"total", "calls"}}."""
    return {name: {"total": n + x if floats else n, "calls": calls} for name, n, x, calls, floats in rows or ()}


def _exemplars(rows, paths: Dict[int, tuple], pid: int) -> list:
    out = []
    for root, seq, slow, sample, wall, t0, tid, parts in rows:
        if root not in paths:
            continue
        breakdown = [{"path": list(paths[n]) if n in paths else list(paths[root]) + ["(other)"], "wall_ns": ns,
                      "split": dict({"on_cpu": cpu if cpu >= 0 else None, "runqueue": rq if rq >= 0 else None,
                                     "awaiting": aw, "loop_ready": loop}, **({"gil": gil} if gil >= 0 else {})),
                      **({"mem_peak_bytes": mem} if mem >= 0 else {})}
                     for n, ns, cpu, rq, aw, loop, gil, mem in parts]
        breakdown.sort(key=lambda b: -b["wall_ns"])
        out.append({"path": list(paths[root]), "wall_ns": wall, "start_ns": t0 - _start_clock, "pid": pid,
                    "tid": tid, "seq": seq, "slow": slow, "sample": sample, "breakdown": breakdown})
    return out


def _save_at_exit() -> None:
    """Save to the configured output: at exit, on a signal (from the main thread's handler, or the bootstrap's
    watcher thread where the main thread is blocked), one at a time."""
    out = _config_now.output
    if not out:
        return
    with _save_lock:
        try:
            snap = snapshot()
            if "{pid}" in out and not len(snap):   # a part per process: one that recorded nothing (a helper such
                return                             # as multiprocessing's resource tracker, ending late) adds none
            snap.save(out.replace("{pid}", str(os.getpid())))
        except Exception as e:
            try:
                sys.stderr.write(f"instrument: could not save the snapshot to {out}: {e}\n")
            except Exception:
                pass


def _after_fork_child() -> None:
    global _start_wall, _start_clock, _held_lock, _save_lock
    try:
        backend.after_fork_child()
        probe.reset()                   # the child's machine is timed by its own calls
        _held_lock = threading.RLock()   # another thread may have held them at the fork
        _save_lock = threading.RLock()
        _held.clear()
        _start_wall, _start_clock = time.time(), backend.now_ns()
        for integ in integrations.registered():
            integrations.call(integ, "after_fork_child")
    except Exception:
        pass


_apply(_config_now, explicit_counters=_config.set_in_env("counters"))
_reference = _machine_reference()
atexit.register(_save_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)
