"""Bottleneck verdicts: where a stage's own time goes, from the data it has.

Each stage is judged on its *self* time (children are judged on their own), with
thresholds passed in, else those recorded in the snapshot's `meta.verdict_thresholds`
(the `verdict_*` options in force when it was taken), else the defaults.  Its wall
time is split into parts (StageStats.wall_split): on a CPU, ready in the run queue,
blocked, instrument's own cost, awaiting, waiting for the event loop; every share a
verdict prints is of the own wall time, and they add up to at most 100 %.  CPU is
the user's: the stage's own thread less instrument's reads at its children's
boundaries, plus the helper threads that run no stage (torch/OpenMP pools) where
their CPU is beyond its interval at 0: CPU/wall above 1 is parallel compute.

- gpu-bound     GPU time / wall >= verdict_gpu_share
- gpu-sync      the profile shows the host blocked in CUDA synchronisation
- instrument    instrument's own reads at its child stages' boundaries are >= half of its own time: its figures
                (system time above all) cannot be told from instrument's
- loop-blocked  woken but waiting for the event loop for >= verdict_loop_share of its time, more than it
                awaited: other stages held the loop (named, with the time each held it)
- waiting       its asyncio task was suspended, awaiting, for at least 1 - verdict_wait_cpu of its time
- cpu-starved   ready but waiting for a CPU (run queue) for >= verdict_runqueue_share of its time, more than it was
                blocked; where the run queue is not readable, off the CPU with more involuntary context switches
                (preemptions) than voluntary ones
- gil-bound     waiting to take the GIL (the split's measured "gil" part) >= a third of its time, and no less than
                it queued for a CPU or was blocked otherwise; where the GIL wait is not measured (gil_wait off, the
                pure-Python recorder): CPU / wall < verdict_wait_cpu, blocked >= a third of its time (more than in
                the run queue), giving up the CPU, while several threads were inside stages at once and the
                process's stages kept a CPU busy (process_evidence)
- waiting       CPU / wall < verdict_wait_cpu otherwise: blocked (I/O, locks, sleep, the device)
- kernel-bound  on the CPU with system (kernel) time >= verdict_kernel_share of its own CPU time (instrument's
                cost counted as system time), over calls long enough, and enough of them, for the kernel's
                tick-sampled accounting to resolve
- memory-bound  cache-miss ratio > verdict_miss_ratio or MPKI > verdict_mpki, with IPC < verdict_low_ipc
                ("memory-bound?" when the misses are high but IPC is unknown)
- compute-bound CPU / wall >= verdict_compute_cpu (and IPC >= verdict_low_ipc where measured)
- mixed         CPU / wall in between
- unknown       no CPU time and no GPU time were measured (also when every call overlapped other tasks on its
                thread with no task-switch hook: their CPU time and counters are left out, never summed)

A verdict never claims more than its numbers: `evidence` holds them, and
`limited_by` names what was missing and would sharpen it.  docs/verdicts.md has the rules in one table.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from .. import config
from .. import counters as _counters
from ..snapshot import SPLIT, Snapshot, StageStats, path_text

HARDWARE = ("cycles", "instructions", "cache-references", "cache-misses")
SYNC_OPS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def thresholds(snap: Optional[Snapshot] = None, given: Optional[Mapping[str, float]] = None) -> Dict[str, float]:
    """The thresholds to judge `snap` by: `given`, else those it was recorded with, else the defaults."""
    th = config.verdict_thresholds()
    if snap is not None:
        recorded = snap.meta.get("verdict_thresholds")
        if isinstance(recorded, Mapping):
            th.update({k: v for k, v in recorded.items() if k in th and isinstance(v, (int, float))})
    if given:
        unknown = sorted(set(given) - set(th))
        if unknown:
            raise ValueError(f"unknown verdict threshold {', '.join(unknown)}; the thresholds are: {', '.join(th)}")
        th.update(given)
    return th


def _self_counter(s: StageStats, name: str) -> Optional[float]:
    c = s.counters.get(name)
    if not c:
        return None
    return c.get("self") if c.get("self") is not None else c.get("total")


def _per_call(s: StageStats, e: Optional[Mapping[str, Any]]) -> Optional[float]:
    return e["self"] / s.cpu_calls if e is not None and s.cpu_calls else None


def _duration(ns: int) -> str:
    return f"{ns / 1e6:.3g} ms" if ns < 1e9 else f"{ns / 1e9:.3g} s"


def blockers_text(s: StageStats, top: int = 3) -> str:
    """`the loop was held by cpu for 38 ms (the calls waited 380 ms for it in all), by ...`: the stages that held the
    event loop while calls of this one were ready, each with the time it held the loop (each moment once) and the
    ready time it cost the calls (summed over them, so it can exceed the wall time); "" when none."""
    rows = sorted(((p, ns) for p, ns in s.loop_blockers.items() if ns > 0), key=lambda r: -r[1])[:top]
    parts = []
    for p, ns in rows:
        waited = s.loop_blockers_waited.get(p)
        parts.append(f"{p} for {_duration(ns)}" + (f" (the calls waited {_duration(waited)} for it in all)" if waited else ""))
    return "the loop was held by " + ", by ".join(parts) if parts else ""


# A call's system time comes from its thread's rusage, which Linux keeps by sampling at the scheduler tick
# (1-10 ms) and spreads over the thread's running time in the ratio sampled so far: over calls much shorter than a
# tick it is that running ratio, not the call's own.  A system share is judged only over calls this long (own CPU),
# and over this much own CPU in all: a dozen ticks of 4 ms, so that a tick more or less in the kernel (or the
# kernel's rescaling of the thread's split to its exact runtime, which can move a whole tick into one call) moves
# the share by less than a tenth.
SYS_RESOLVED_NS = 1_000_000
SYS_RESOLVED_TOTAL_NS = 50_000_000
# The stage's own time is mostly instrument's (the reads at its children's boundaries) from this share on.
OWN_COST_SHARE = 0.5


def _shares(s: StageStats, wall: int) -> Dict[str, float]:
    """Each measured part of the stage's own time (SPLIT; one not measured is absent) as a share of one
    denominator, the own wall time (or the parts' sum where estimates stray above it): they add up to at most 1."""
    parts = {p: max(v, 0) for p in SPLIT for v in (s.split_part(p, True),) if v is not None}
    den = max(wall, sum(parts.values()))
    return {p: v / den for p, v in parts.items()} if den > 0 else {}


def _evidence(s: StageStats, wall: int, shares: Mapping[str, float]) -> Dict[str, Any]:
    """The numbers a verdict rests on: self time, the wall-time split's shares, switches, helpers, system time."""
    ev: Dict[str, Any] = {"self_ms": round(wall / 1e6, 3)}
    if s.overlapped_calls:
        ev["overlapped_calls"] = s.overlapped_calls
    split = {p: round(v, 3) for p, v in shares.items() if v or p in ("on_cpu", "runqueue")}
    if split:
        ev["split"] = split
    for kind, key in (("involuntary", "preemptions_per_call"), ("voluntary", "voluntary_switches_per_call")):
        x = _per_call(s, s.switches.get(kind))
        if x is not None:
            ev[key] = round(x, 2)
    helpers = s.helpers_beyond_noise()
    if s.helpers is not None and wall:
        ev["helpers_per_wall"] = round(helpers / wall, 3)   # 0 where within its interval at 0
    if s.instrument_self:
        ev["instrument_ms"] = round(s.instrument_self / 1e6, 3)
    user_sys = _user_sys_share(s)
    if user_sys is not None:
        ev["sys_share"] = round(user_sys, 3)
        ev["sys_resolved"] = _sys_resolved(s)
        if s.calls and s.cpu_sys_self is not None:
            ev["sys_ms_per_call"] = round(max(s.cpu_sys_self - s.instrument_self, 0) / s.calls / 1e6, 4)
    faults = _self_counter(s, "page-faults")
    if faults is None:
        faults = _self_counter(s, "minor-faults")
    if faults is not None and s.calls:
        ev["page_faults_per_call"] = round(faults / s.calls, 1)
    cs = _self_counter(s, "context-switches")
    if cs is not None and s.calls:
        ev["context_switches_per_call"] = round(cs / s.calls, 2)
    return ev


def _user_cpu(s: StageStats) -> Optional[float]:
    """The stage's own CPU time less instrument's (the reads at its children's boundaries): its split's on_cpu."""
    on = s.split_part("on_cpu", True)
    return None if on is None else max(on, 0)


def _user_sys_share(s: StageStats) -> Optional[float]:
    """System share of the user's own CPU time, counting instrument's whole cost as system time (most of it is
    system calls): a lower bound of the user code's share."""
    cpu = _user_cpu(s)
    if s.cpu_sys_self is None or not cpu:
        return None
    return min(1.0, max(0.0, (s.cpu_sys_self - s.instrument_self) / cpu))


def _sys_resolved(s: StageStats) -> bool:
    cpu = _user_cpu(s)
    return bool(cpu and s.cpu_calls and cpu / s.cpu_calls >= SYS_RESOLVED_NS and cpu >= SYS_RESOLVED_TOTAL_NS)


def _cpu_per_wall(s: StageStats, wall: int) -> Optional[float]:
    """The user's CPU time (the stage's thread, less instrument's own, and helper threads' beyond their noise) per
    wall time, over the calls whose CPU was measured."""
    cpu = _user_cpu(s)
    if cpu is None or not s.cpu_calls or not wall:
        return None
    measured = (wall * s.cpu_calls / s.calls if s.calls else wall) - (s.split_part("instrument", True) or 0)
    return (cpu + s.helpers_beyond_noise()) / measured if measured > 0 else None


def judge(s: StageStats, th: Mapping[str, float], process: Optional[Mapping[str, float]] = None,
          busiest: Sequence[str] = ()) -> Dict[str, Any]:
    """The verdict of one stage: {"verdict", "reason", "evidence", "limited_by"}.  `process`: what the whole
    snapshot shows of the process (`process_evidence`), for the rules that look beyond the stage; `busiest`: its
    stages most on a CPU (`busiest_stages`), where a stage that waits for the GIL would look for its holders."""
    wall = s.wall_self if s.wall_self else s.wall_total
    shares = _shares(s, wall)
    ev = _evidence(s, wall, shares)
    cpu_ratio = _cpu_per_wall(s, wall)
    if cpu_ratio is not None:
        ev["cpu_per_wall"] = round(cpu_ratio, 3)
    if process:
        ev.update({k: round(v, 3) for k, v in process.items()})
    gpu_share = None
    if s.gpu and s.gpu.get("total_ns") is not None and s.wall_total:
        gpu_share = s.gpu["total_ns"] / s.wall_total
        ev["gpu_per_wall"] = round(gpu_share, 3)
    sel = {n: _self_counter(s, n) for n in HARDWARE}
    derived = _counters.derived(sel, wall)
    ipc, miss, mpki = derived.get("ipc"), derived.get("cache_miss_ratio"), derived.get("mpki")
    for k, v in (("ipc", ipc), ("cache_miss_ratio", miss), ("mpki", mpki)):
        if v is not None:
            ev[k] = round(v, 3)
    limited = [n for n in HARDWARE if sel[n] is None]
    if _user_sys_share(s) is not None and not _sys_resolved(s):
        short = (_user_cpu(s) or 0) / max(s.cpu_calls, 1) < SYS_RESOLVED_NS
        limited.append("system time (" + ("its calls are shorter than" if short else "its CPU time in all, under "
                       f"{SYS_RESOLVED_TOTAL_NS // 1_000_000} ms, is less than") + " the kernel's tick-sampled "
                       "accounting resolves)")
    sync = _sync_share(s)
    if sync is not None:
        ev["sync_share_of_self_cpu"] = round(sync, 3)

    def out(verdict: str, reason: str) -> Dict[str, Any]:
        return {"verdict": verdict, "reason": reason, "evidence": ev, "limited_by": limited}

    if gpu_share is not None and gpu_share >= th["gpu_share"]:
        return out("gpu-bound", f"GPU time is {gpu_share:.0%} of wall time")
    if sync is not None and sync >= 0.5:
        return out("gpu-sync", f"{sync:.0%} of the stage's CPU time is spent in CUDA synchronisation")
    sdk = shares.get("instrument", 0.0)
    if sdk >= OWN_COST_SHARE:
        return out("instrument", f"{sdk:.0%} of its own time is instrument's reads at its child stages' boundaries "
                   f"({s.instrument_self / 1e6:.3g} ms): the code of its own took "
                   f"{shares.get('on_cpu', 0):.0%} on a CPU; its system time cannot be told from instrument's")
    off = _off_cpu(s, shares, cpu_ratio, th, process or {}, busiest, out)
    if off is not None:
        return off
    if cpu_ratio is None and gpu_share is None:
        if s.overlapped_calls:
            return out("unknown", f"{s.overlapped_calls} of {s.calls} calls overlapped other tasks on their thread with "
                       "no task-switch hook to tell them apart: their CPU time and counters are left out")
        return out("unknown", "no CPU or GPU time was measured for this stage")
    return _on_cpu(s, cpu_ratio, gpu_share, ipc, miss, mpki, limited, ev, th, out)


def _off_cpu(s: StageStats, share: Mapping[str, float], cpu_ratio: Optional[float], th: Mapping[str, float],
             process: Mapping[str, float], busiest: Sequence[str], out) -> Optional[dict]:
    """loop-blocked, cpu-starved, gil-bound or waiting, when the stage's time went off the CPU; None otherwise."""
    loop, awaiting, rq, blocked = (share.get(p, 0.0) for p in ("loop_ready", "awaiting", "runqueue", "blocked"))
    on, gil = share.get("on_cpu", 0.0), share.get("gil", 0.0)
    if loop >= th["loop_share"] and loop >= awaiting and loop >= max(rq, blocked):
        held = blockers_text(s)
        return out("loop-blocked", f"woken but waiting for the event loop {loop:.0%} of its own time"
                   + (f": {held}" if held else ""))
    if awaiting >= 1 - th["wait_cpu"]:
        return out("waiting", f"its task was suspended, awaiting, {awaiting:.0%} of its own time; on a CPU {on:.0%}")
    if cpu_ratio is None:
        return None
    if s.gil_self is not None and gil >= GIL_SHARE and gil >= max(rq, blocked):
        return out("gil-bound", f"waiting to take the GIL {gil:.0%} of its own time, on a CPU {on:.0%}, in the run "
                   f"queue {rq:.0%}, blocked {blocked:.0%}" + _gil_holders(s, busiest))
    if s.runqueue is not None and rq >= th["runqueue_share"] and rq >= blocked:
        why = f"ready but waiting for a CPU (run queue) {rq:.0%} of its own time, on a CPU {on:.0%}"
        p = (s.switches.get("involuntary") or {}).get("self")
        if p is not None and s.cpu_calls:
            why += f"; {p / s.cpu_calls:.2g} preemptions per call"
        return out("cpu-starved", why)
    if cpu_ratio >= th["wait_cpu"]:
        return None
    inv, vol = (_per_call(s, s.switches.get(k)) for k in ("involuntary", "voluntary"))
    if s.runqueue is None and inv is not None and vol is not None and inv > vol and inv >= 1:
        return out("cpu-starved", f"CPU/wall {cpu_ratio:.2f} with {inv:.2g} preemptions per call and {vol:.2g} "
                   "voluntary switches: the thread was taken off the CPU, not waiting (run-queue time not readable)")
    if s.gil_self is None and _gil_bound(s, blocked, rq, vol, process):
        return out("gil-bound", f"blocked {blocked:.0%} of its own time, on a CPU {on:.0%}, while other threads ran "
                   f"Python: the process's stages were on a CPU {process['stage_cpu_cores']:.2g} cores on average "
                   f"with {process['stage_threads']:.2g} threads inside stages at once, and only one runs Python at "
                   "a time (most likely waiting for the GIL)")
    why = f"CPU/wall {cpu_ratio:.2f}: the thread was off the CPU by its own doing (I/O, locks, sleep, the GIL or " \
          "waiting on the device)"
    if s.runqueue is not None:
        why += f"; blocked {blocked:.0%} of its own time, in the run queue {rq:.0%}"
    if vol is not None and vol >= 1:
        why += f"; {vol:.2g} voluntary context switches per call (the thread gave up the CPU)"
    if s.gpu and s.gpu.get("total_ns") is not None and s.wall_total:
        why += f"; GPU time covers only {s.gpu['total_ns'] / s.wall_total:.0%}"
    return out("waiting", why)


# gil-bound: waiting to take the GIL (measured: the split's "gil" part) a third of its own time or more, and at least
# as long as it queued for a CPU or was blocked otherwise
GIL_SHARE = 1 / 3


def _gil_holders(s: StageStats, busiest: Sequence[str]) -> str:
    """Which stages held the GIL is not sampled; the stages of the process most on a CPU are where to look."""
    names = [p for p in busiest if p != path_text(s.path)][:3]
    return f"; which stage held it is not sampled: the stages most on a CPU were {', '.join(names)}" if names else ""


def busiest_stages(snap: Snapshot, n: int = 4) -> List[str]:
    """The snapshot's stages by their own time on a CPU, most first (those with any)."""
    on = [(s.split_part("on_cpu", True) or 0, path_text(s.path)) for s in snap.stages if s.calls]
    return [p for v, p in sorted(on, key=lambda x: -x[0])[:n] if v > 0]


# gil-bound, where the GIL wait is not measured (the pure-Python recorder, gil_wait off): blocked a third of its own
# time or more (and more than it queued for a CPU), giving up the CPU, while several threads were inside stages at
# once and the process's stages kept a CPU busy (Python runs on one thread at a time); a thread that waits for the
# GIL also queues for a CPU each time it is woken to check it, so the blocked part is a lower bound of the wait
GIL_BLOCKED_SHARE = 1 / 3
GIL_STAGE_THREADS = 1.5
GIL_STAGE_CPU_CORES = 0.3


def _gil_bound(s: StageStats, blocked: float, rq: float, vol: Optional[float], process: Mapping[str, float]) -> bool:
    if s.runqueue is None or blocked < GIL_BLOCKED_SHARE or blocked < rq or vol is None or vol < 1:
        return False
    return (process.get("stage_threads", 0.0) >= GIL_STAGE_THREADS
            and process.get("stage_cpu_cores", 0.0) >= GIL_STAGE_CPU_CORES)


def process_evidence(snap: Snapshot) -> Dict[str, float]:
    """What the snapshot shows of the process as a whole, over its recording: the stages' own CPU time (less
    instrument's) per wall second (`stage_cpu_cores`), and the outermost stages' wall time per wall second (the
    threads or tasks inside stages at once, on average: `stage_threads`).  Of a merge, per second that one of its
    processes (or windows) recorded."""
    meta = snap.meta
    window = meta.get("window") or {}
    span = meta.get("duration_ns") or 0
    if window.get("duration_ns"):   # a window (since()): its own time, not the whole recording's
        span = window["duration_ns"]
    elif meta.get("merged_from"):   # a merge: per process (or window), the time each recorded, summed
        span = sum(max((x.get("end_time") or 0) - (x.get("start_time") or 0), 0) for x in meta["merged_from"]) * 1e9
    elif window.get("start_time") is not None and window.get("end_time") is not None:   # a window of a merge
        span = max(window["end_time"] - window["start_time"], 0) * 1e9
    if span <= 0:
        return {}
    cpu = sum(_user_cpu(s) or 0 for s in snap.stages if s.calls)
    roots = sum(s.wall_total - s.suspended_total for s in snap.stages if s.calls and len(s.path) == 1)
    return {"stage_cpu_cores": cpu / span, "stage_threads": roots / span}


def _on_cpu(s: StageStats, cpu_ratio: Optional[float], gpu_share: Optional[float], ipc, miss, mpki, limited,
            ev: Dict[str, Any], th: Mapping[str, float], out) -> Dict[str, Any]:
    """kernel-bound, memory-bound, compute-bound, mixed: a stage that spends its time on a CPU."""
    sys_share = _user_sys_share(s) if _sys_resolved(s) else None
    if sys_share is not None and sys_share >= th["kernel_share"] and cpu_ratio is not None:
        why = f"{sys_share:.0%} of its CPU time is in the kernel (CPU/wall {cpu_ratio:.2f})"
        if "page_faults_per_call" in ev:
            why += f"; {ev['page_faults_per_call']:g} page faults per call"
        return out("kernel-bound", why)
    high_miss = (miss is not None and miss > th["miss_ratio"]) or (mpki is not None and mpki > th["mpki"])
    if high_miss:
        if ipc is None:
            return out("memory-bound?", f"cache-miss ratio {miss if miss is not None else float('nan'):.2f}, "
                       "IPC unknown (cycles/instructions not counted)")
        if ipc < th["low_ipc"]:
            return out("memory-bound", f"IPC {ipc:.2f} with cache-miss ratio "
                       f"{miss if miss is not None else float('nan'):.2f} / MPKI {mpki if mpki is not None else float('nan'):.1f}")
    if cpu_ratio is not None and cpu_ratio >= th["compute_cpu"]:
        if ipc is not None and ipc < th["low_ipc"]:
            return out("mixed", f"on the CPU (CPU/wall {cpu_ratio:.2f}) but IPC is low ({ipc:.2f}) without high misses: "
                       "stalls of another kind (branches, dependencies)")
        why = f"CPU/wall {cpu_ratio:.2f}"
        if ev.get("helpers_per_wall"):   # beyond their noise
            why += f" with helper threads' CPU ({ev['helpers_per_wall']:.2f} of wall: parallel compute)"
        if ipc is not None:
            why += f", IPC {ipc:.2f}"
        else:
            why += ("; no hardware counters, so a memory-bound stage would look the same (count "
                    f"{', '.join(n for n in limited if n in HARDWARE)} on a machine with a PMU to tell)")
        return out("compute-bound", why)
    if cpu_ratio is not None:
        why = f"CPU/wall {cpu_ratio:.2f}: part computing, part waiting"
        split = ev.get("split") or {}
        if s.runqueue is not None:
            why += f" (in the run queue {split.get('runqueue', 0):.0%}, blocked {split.get('blocked', 0):.0%} of its own time)"
        if ev.get("helpers_per_wall"):
            why += (f"; helper threads' CPU {ev['helpers_per_wall']:.2f} of wall: a thread that hands work to a pool "
                    "blocks until the pool is done, and the pool's own wait for a CPU is not read")
        return out("mixed", why)
    return out("unknown", "only GPU time was measured, and it does not dominate")


def _sync_share(s: StageStats) -> Optional[float]:
    ops = (s.ops or {}).get("by_self_cpu") or []
    if not ops:
        return None
    total = sum(o.get("self_cpu_ns") or 0 for o in ops)
    sync = sum(o.get("self_cpu_ns") or 0 for o in ops if any(k in o.get("name", "") for k in SYNC_OPS))
    return sync / total if total else None


FRESH_MEMORY = 1 << 20   # a call's own peak above its start from which its fresh memory is named (1 MiB)


def fresh_memory(snap: Snapshot, s: StageStats) -> Optional[Dict[str, Any]]:
    """Whether the stage's calls mostly touch fresh memory of their own: most of its calls measured rose the
    resident set 1 MiB or more above their start, and its mean peak, less its largest child's (a child's pages are
    the child's), is at least FRESH_MEMORY.  Its figures: that own peak, the net change, the share of calls and the
    stage's own page faults per call, in MiB and counts; None otherwise."""
    f = s.memory_of("host")
    if not f or f["peak_mean"] is None or 2 * f["fresh"] <= f["calls"]:
        return None
    kids = [(c.memory_of("host") or {}).get("peak_mean") or 0.0 for c in snap.children(s.path)]
    own = f["peak_mean"] - max(kids, default=0.0)
    if own < FRESH_MEMORY:
        return None
    faults = _self_counter(s, "page-faults")
    out = {"peak_mib": round(f["peak_mean"] / 2 ** 20, 1), "own_peak_mib": round(own / 2 ** 20, 1),
           "net_mib": round(f["net_mean"] / 2 ** 20, 1), "calls_measured": f["calls"], "fresh_calls": f["fresh"]}
    if faults is not None and s.calls:
        out["page_faults_per_call"] = round(faults / s.calls, 1)
    return out


def memory_text(m: Mapping[str, Any], faults_said: bool = False) -> str:
    """`touches fresh memory: 64 MiB peak per call above its start, its own (net 0 MiB), 33 page faults per call`
    (the faults left out where the reason gives them already)."""
    faults = f", {m['page_faults_per_call']:g} page faults per call" if "page_faults_per_call" in m and \
        not faults_said else ""
    return (f"touches fresh memory: {m['own_peak_mib']:g} MiB peak per call above its start, its own (net "
            f"{m['net_mib']:g} MiB; {m['fresh_calls']} of {m['calls_measured']} calls measured took 1 MiB or "
            f"more){faults}")


class Pending(Mapping):
    """A stage's verdict, judged when it is first read: a snapshot of a thousand stages costs the verdicts only of
    those asked for.  A read-only mapping like the verdict it stands for (`dict(v)` for a plain dict; it pickles as
    one)."""
    __slots__ = ("_judge", "_value")

    def __init__(self, judge_it) -> None:
        self._judge, self._value = judge_it, None

    def _get(self) -> Dict[str, Any]:
        v = self._value
        if v is None:
            j = self._judge
            v = j() if j is not None else self._value   # another thread set it before letting go of the judge
            self._value, self._judge = v, None
        return v

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())

    def __reduce__(self):
        return dict, (dict(self._get()),)


def with_verdicts(snap: Snapshot, th: Optional[Mapping[str, float]] = None) -> Snapshot:
    """A copy of `snap` whose stages carry their verdicts (thresholds as in `thresholds()`), each judged when first
    read (`Pending`); a stage whose calls touch fresh memory of their own (fresh_memory) says so, in `memory` and at
    the end of its reason."""
    th = thresholds(snap, th)
    whole: Dict[str, Any] = {}   # what the verdicts read of the whole snapshot, found once, when the first is read

    def judged(s: StageStats) -> Dict[str, Any]:
        if not whole:
            whole.update(process=process_evidence(snap), busiest=busiest_stages(snap))
        v = judge(s, th, whole["process"], whole["busiest"])
        m = fresh_memory(snap, s)
        if m is not None:
            v = dict(v, reason=f"{v['reason']}; {memory_text(m, 'page faults per call' in v['reason'])}", memory=m)
        return v
    stages = [s.evolve(verdict=Pending(lambda s=s: judged(s))) if s.calls else s for s in snap.stages]
    meta = snap.meta
    meta["verdict_thresholds"] = th
    meta["judged"] = True   # a file of it gives them back when loaded
    return snap.replaced(stages, meta)
