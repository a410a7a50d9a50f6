"""Bottleneck verdicts: where a stage's own time goes, from the data it has.

Each stage is judged on its *self* time (children are judged on their own), with
thresholds passed in, else those recorded in the snapshot's `meta.verdict_thresholds`
(the `verdict_*` options in force when it was taken), else the defaults.  Its wall
time is split into parts (StageStats.wall_split): on a CPU, ready in the run queue,
blocked, awaiting, waiting for the event loop.  CPU counts the stage's own thread
and the helper threads that run no stage (torch/OpenMP pools): CPU/wall above 1 is
parallel compute, not waiting.

- gpu-bound     GPU time / wall >= verdict_gpu_share
- gpu-sync      the profile shows the host blocked in CUDA synchronisation
- loop-blocked  woken but waiting for the event loop for >= verdict_loop_share of its time, more than it
                awaited: other stages held the loop (named, with the time)
- waiting       its asyncio task was suspended, awaiting, for at least 1 - verdict_wait_cpu of its time
- cpu-starved   ready but waiting for a CPU (run queue) for >= verdict_runqueue_share of its time, more than it was
                blocked; where the run queue is not readable, off the CPU with more involuntary context switches
                (preemptions) than voluntary ones
- waiting       CPU / wall < verdict_wait_cpu otherwise: blocked (I/O, locks, sleep, the GIL, the device)
- kernel-bound  on the CPU with system (kernel) time >= verdict_kernel_share of its CPU time
- memory-bound  cache-miss ratio > verdict_miss_ratio or MPKI > verdict_mpki, with IPC < verdict_low_ipc
                ("memory-bound?" when the misses are high but IPC is unknown)
- compute-bound CPU / wall >= verdict_compute_cpu (and IPC >= verdict_low_ipc where measured)
- mixed         CPU / wall in between
- unknown       no CPU time and no GPU time were measured (also when every call overlapped other tasks on its
                thread with no task-switch hook: their CPU time and counters are left out, never summed)

A verdict never claims more than its numbers: `evidence` holds them, and
`limited_by` names the counters that were missing and would sharpen it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Mapping, Optional

from .. import config
from .. import counters as _counters
from ..snapshot import Snapshot, StageStats

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


def _evidence(s: StageStats, wall: int) -> Dict[str, Any]:
    """The numbers a verdict rests on: self time, the wall-time split's shares, switches, helpers, system time."""
    ev: Dict[str, Any] = {"self_ms": round(wall / 1e6, 3)}
    if s.overlapped_calls:
        ev["overlapped_calls"] = s.overlapped_calls
    if wall > 0:
        shares = {}
        for part in ("on_cpu", "runqueue", "blocked", "awaiting", "loop_ready"):
            v = s.split_part(part, True)
            if v is not None and (v or part in ("on_cpu", "runqueue")):
                shares[part] = round(max(v, 0) / wall, 3)
        if shares:
            ev["split"] = shares
    for kind, key in (("involuntary", "preemptions_per_call"), ("voluntary", "voluntary_switches_per_call")):
        x = _per_call(s, s.switches.get(kind))
        if x is not None:
            ev[key] = round(x, 2)
    if s.helpers is not None and wall:
        ev["helpers_per_wall"] = round(max(s.helpers["self"], 0) / wall, 3)
    if s.sys_share is not None:
        ev["sys_share"] = round(s.sys_share, 3)
        if s.calls and s.cpu_sys_self is not None:
            ev["sys_ms_per_call"] = round(s.cpu_sys_self / s.calls / 1e6, 4)
    faults = _self_counter(s, "page-faults")
    if faults is None:
        faults = _self_counter(s, "minor-faults")
    if faults is not None and s.calls:
        ev["page_faults_per_call"] = round(faults / s.calls, 1)
    cs = _self_counter(s, "context-switches")
    if cs is not None and s.calls:
        ev["context_switches_per_call"] = round(cs / s.calls, 2)
    return ev


def _cpu_per_wall(s: StageStats, wall: int) -> Optional[float]:
    """CPU time (the stage's thread and its helper threads) per wall time, over the calls whose CPU was measured."""
    if s.cpu_self is None or not s.cpu_calls or not wall:
        return None
    measured = wall * s.cpu_calls / s.calls if s.calls else wall
    helpers = max(s.helpers["self"], 0) if s.helpers is not None else 0
    return (max(s.cpu_self, 0) + helpers) / measured if measured else None


def judge(s: StageStats, th: Mapping[str, float]) -> Dict[str, Any]:
    """The verdict of one stage: {"verdict", "reason", "evidence", "limited_by"}."""
    wall = s.wall_self if s.wall_self else s.wall_total
    ev = _evidence(s, wall)
    cpu_ratio = _cpu_per_wall(s, wall)
    if cpu_ratio is not None:
        ev["cpu_per_wall"] = round(cpu_ratio, 3)
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
    sync = _sync_share(s)
    if sync is not None:
        ev["sync_share_of_self_cpu"] = round(sync, 3)

    def out(verdict: str, reason: str) -> Dict[str, Any]:
        return {"verdict": verdict, "reason": reason, "evidence": ev, "limited_by": limited}

    if gpu_share is not None and gpu_share >= th["gpu_share"]:
        return out("gpu-bound", f"GPU time is {gpu_share:.0%} of wall time")
    if sync is not None and sync >= 0.5:
        return out("gpu-sync", f"{sync:.0%} of the stage's CPU time is spent in CUDA synchronisation")
    off = _off_cpu(s, wall, cpu_ratio, th, out)
    if off is not None:
        return off
    if cpu_ratio is None and gpu_share is None:
        if s.overlapped_calls:
            return out("unknown", f"{s.overlapped_calls} of {s.calls} calls overlapped other tasks on their thread with "
                       "no task-switch hook to tell them apart: their CPU time and counters are left out")
        return out("unknown", "no CPU or GPU time was measured for this stage")
    return _on_cpu(s, cpu_ratio, gpu_share, ipc, miss, mpki, limited, ev, th, out)


def _off_cpu(s: StageStats, wall: int, cpu_ratio: Optional[float], th: Mapping[str, float], out) -> Optional[dict]:
    """loop-blocked, cpu-starved or waiting, when the stage's time went off the CPU; None otherwise."""
    share = {} if not wall else {p: max(s.split_part(p, True) or 0, 0) / wall
                                 for p in ("runqueue", "blocked", "awaiting", "loop_ready")}
    loop, awaiting, rq, blocked = (share.get(p, 0.0) for p in ("loop_ready", "awaiting", "runqueue", "blocked"))
    if loop >= th["loop_share"] and loop >= awaiting and loop >= max(rq, blocked):
        held = blockers_text(s)
        return out("loop-blocked", f"woken but waiting for the event loop {loop:.0%} of its own time"
                   + (f": {held}" if held else ""))
    if awaiting >= 1 - th["wait_cpu"]:
        why = f"its task was suspended, awaiting, {awaiting:.0%} of the stage's own time"
        if cpu_ratio is not None:
            why += f"; CPU/wall {cpu_ratio:.2f}"
        return out("waiting", why)
    if cpu_ratio is None:
        return None
    if s.runqueue is not None and rq >= th["runqueue_share"] and rq >= blocked:
        why = f"ready but waiting for a CPU (run queue) {rq:.0%} of its own time, on a CPU {cpu_ratio:.0%}"
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
    why = f"CPU/wall {cpu_ratio:.2f}: the thread was off the CPU by its own doing (I/O, locks, sleep, the GIL or " \
          "waiting on the device)"
    if s.runqueue is not None:
        why += f"; blocked {blocked:.0%} of its own time, in the run queue {rq:.0%}"
    if vol is not None and vol >= 1:
        why += f"; {vol:.2g} voluntary context switches per call (the thread gave up the CPU)"
    if s.gpu and s.gpu.get("total_ns") is not None and s.wall_total:
        why += f"; GPU time covers only {s.gpu['total_ns'] / s.wall_total:.0%}"
    return out("waiting", why)


def _on_cpu(s: StageStats, cpu_ratio: Optional[float], gpu_share: Optional[float], ipc, miss, mpki, limited,
            ev: Dict[str, Any], th: Mapping[str, float], out) -> Dict[str, Any]:
    """kernel-bound, memory-bound, compute-bound, mixed: a stage that spends its time on a CPU."""
    sys_share = s.sys_share
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
        if ev.get("helpers_per_wall"):
            why += f" with helper threads' CPU ({ev['helpers_per_wall']:.2f} of wall: parallel compute)"
        if ipc is not None:
            why += f", IPC {ipc:.2f}"
        else:
            why += ("; no hardware counters, so a memory-bound stage would look the same (count "
                    f"{', '.join(limited)} on a machine with a PMU to tell)")
        return out("compute-bound", why)
    if cpu_ratio is not None:
        return out("mixed", f"CPU/wall {cpu_ratio:.2f}: part computing, part waiting")
    return out("unknown", "only GPU time was measured, and it does not dominate")


def _sync_share(s: StageStats) -> Optional[float]:
    ops = (s.ops or {}).get("by_self_cpu") or []
    if not ops:
        return None
    total = sum(o.get("self_cpu_ns") or 0 for o in ops)
    sync = sum(o.get("self_cpu_ns") or 0 for o in ops if any(k in o.get("name", "") for k in SYNC_OPS))
    return sync / total if total else None


def with_verdicts(snap: Snapshot, th: Optional[Mapping[str, float]] = None) -> Snapshot:
    """A copy of `snap` whose stages carry their verdicts (thresholds as in `thresholds()`)."""
    th = thresholds(snap, th)
    stages = [replace(s, verdict=judge(s, th)) if s.calls else s for s in snap.stages]
    meta = snap.meta
    meta["verdict_thresholds"] = th
    return Snapshot(stages, meta, snap.events, snap.exemplars)
