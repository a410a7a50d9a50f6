"""Bottleneck verdicts: where a stage's own time goes, from the data it has.

Each stage is judged on its *self* time (children are judged on their own), with
thresholds passed in, else those recorded in the snapshot's `meta.verdict_thresholds`
(the `verdict_*` options in force when it was taken), else the defaults:

- gpu-bound   GPU time / wall >= verdict_gpu_share
- gpu-sync    the profile shows the host blocked in CUDA synchronisation
- waiting     CPU / wall < verdict_wait_cpu and no GPU time explains it, or its asyncio task was suspended
              (awaiting) for at least 1 - verdict_wait_cpu of the stage's own time
- memory-bound  cache-miss ratio > verdict_miss_ratio or MPKI > verdict_mpki, with IPC < verdict_low_ipc
              ("memory-bound?" when the misses are high but IPC is unknown)
- kernel-bound  on the CPU (CPU / wall >= verdict_wait_cpu) with system (kernel) time >= verdict_kernel_share
              of its CPU time: page faults of fresh memory, system calls
- compute-bound CPU / wall >= verdict_compute_cpu (and IPC >= verdict_low_ipc where measured)
- mixed       CPU / wall in between
- unknown     no CPU time and no GPU time were measured (also when every call overlapped other tasks on its
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


def judge(s: StageStats, th: Mapping[str, float]) -> Dict[str, Any]:
    """The verdict of one stage: {"verdict", "reason", "evidence", "limited_by"}."""
    wall = s.wall_self if s.wall_self else s.wall_total
    ev: Dict[str, Any] = {"self_ms": round(wall / 1e6, 3)}
    if s.overlapped_calls:
        ev["overlapped_calls"] = s.overlapped_calls
    suspended = s.suspended_share if s.suspended_self else None
    if suspended is not None:
        ev["suspended_share"] = round(suspended, 3)
    cpu_ratio = None
    if s.cpu_self is not None and s.cpu_calls and wall:
        measured_wall = wall * s.cpu_calls / s.calls if s.calls else wall
        cpu_ratio = s.cpu_self / measured_wall if measured_wall else None
        ev["cpu_per_wall"] = round(cpu_ratio, 3)
    gpu_share = None
    if s.gpu and s.gpu.get("total_ns") is not None and s.wall_total:
        gpu_share = s.gpu["total_ns"] / s.wall_total
        ev["gpu_per_wall"] = round(gpu_share, 3)
    sel = {n: _self_counter(s, n) for n in HARDWARE}
    ipc = _counters.derived(sel, wall).get("ipc")
    miss = _counters.derived(sel, wall).get("cache_miss_ratio")
    mpki = _counters.derived(sel, wall).get("mpki")
    for k, v in (("ipc", ipc), ("cache_miss_ratio", miss), ("mpki", mpki)):
        if v is not None:
            ev[k] = round(v, 3)
    cs = _self_counter(s, "context-switches")
    if cs is not None and s.calls:
        ev["context_switches_per_call"] = round(cs / s.calls, 2)
    sys_share = s.sys_share
    if sys_share is not None:
        ev["sys_share"] = round(sys_share, 3)
        if s.calls and s.cpu_sys_self is not None:
            ev["sys_ms_per_call"] = round(s.cpu_sys_self / s.calls / 1e6, 4)
    faults = _self_counter(s, "page-faults")
    if faults is None:
        faults = _self_counter(s, "minor-faults")
    if faults is not None and s.calls:
        ev["page_faults_per_call"] = round(faults / s.calls, 1)
    limited = [n for n in HARDWARE if sel[n] is None]

    def out(verdict: str, reason: str) -> Dict[str, Any]:
        return {"verdict": verdict, "reason": reason, "evidence": ev, "limited_by": limited}

    sync = _sync_share(s)
    if sync is not None:
        ev["sync_share_of_self_cpu"] = round(sync, 3)
    if gpu_share is not None and gpu_share >= th["gpu_share"]:
        return out("gpu-bound", f"GPU time is {gpu_share:.0%} of wall time")
    if sync is not None and sync >= 0.5:
        return out("gpu-sync", f"{sync:.0%} of the stage's CPU time is spent in CUDA synchronisation")
    if suspended is not None and suspended >= 1 - th["wait_cpu"]:
        why = f"its task was suspended (awaiting) {suspended:.0%} of the stage's own time"
        if cpu_ratio is not None:
            why += f"; CPU/wall {cpu_ratio:.2f}"
        return out("waiting", why)
    if cpu_ratio is None and gpu_share is None:
        if s.overlapped_calls:
            return out("unknown", f"{s.overlapped_calls} of {s.calls} calls overlapped other tasks on their thread with "
                       "no task-switch hook to tell them apart: their CPU time and counters are left out")
        return out("unknown", "no CPU or GPU time was measured for this stage")
    if cpu_ratio is not None and cpu_ratio < th["wait_cpu"]:
        why = f"CPU/wall {cpu_ratio:.2f}: the thread was off the CPU (I/O, locks, sleep or waiting on the device)"
        if "context_switches_per_call" in ev:
            why += f"; {ev['context_switches_per_call']} context switches per call"
        if gpu_share is not None:
            why += f"; GPU time covers only {gpu_share:.0%}"
        return out("waiting", why)
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
