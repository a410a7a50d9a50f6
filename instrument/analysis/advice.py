"""Where to look next: the stages with the most self time, each with its verdict,
the next step that fits it and the most its removal could save."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ..snapshot import Snapshot
from .tail import PART_TEXT, tail
from .verdict import with_verdicts

NEXT_STEP = {
    "compute-bound": ("profile its operators: `with instrument.profile() as prof:` around the work shows the "
                      "torch operators under `{name}`; for pure-Python code, a sampling profiler on it "
                      "(py-spy, pyinstrument) shows the hot lines"),
    "memory-bound": "improve locality (contiguous tensors, batching, smaller working set) and compare "
                    "cache-misses before/after with `instrument diff`",
    "memory-bound?": "count cycles,instructions too (the default counters, on a machine with a PMU) to "
                     "confirm the memory-bound suspicion",
    "gpu-bound": "look at its kernels on the timeline: `instrument nsys --capture {name} -- python ...`",
    "gpu-sync": "find the synchronisation on the timeline: `instrument nsys --capture {name} -- python ...`; "
                "remove .item()/.cpu()/synchronize() calls from the hot path",
    "waiting": "find what it waits on: context switches and CPU/wall are in the table; for host waits on the "
               "GPU, `instrument nsys --capture {name} -- python ...` shows them",
    "kernel-bound": ("its time goes to the kernel: page faults of fresh memory (reuse or preallocate buffers, keep "
                     "tensors and arrays alive across calls, huge pages for large allocations) or system calls "
                     "(batch them, buffer I/O); compare page-faults and sys% before/after with `instrument diff`"),
    "cpu-starved": ("it was ready to run but had no CPU: run fewer threads or processes than cores "
                    "(torch.set_num_threads, the worker count) or give the service more CPUs; compare the run-queue "
                    "share of its split before/after with `instrument diff`"),
    "loop-blocked": ("other stages held the event loop while its task was ready (its verdict names them): move "
                     "their work off the loop (asyncio.to_thread, run_in_executor) or split it with awaits"),
    "instrument": ("its own time is mostly instrument's reads at its children's boundaries: read fewer calls "
                   "(overhead_budget), or make its child stages fewer and larger"),
    "gil-bound": ("its threads queue for Python's global interpreter lock: run fewer Python threads, spread the work "
                  "over processes, move the hot loop to code that releases the GIL (numpy, torch, I/O, a native "
                  "extension), or use a free-threaded build"),
    "mixed": "split it into smaller stages to separate the computing from the waiting",
    "unknown": "turn on the CPU clock or task-clock counter (configure(cpu_clock=True)) so it can be judged",
}


FRESH_MEMORY_STEP = ("it touches fresh memory on every call: reuse buffers (out= arguments, a pool kept across "
                     "calls), pin and preallocate host buffers once, avoid copies (views, torch.from_numpy, in-place "
                     "operations); compare its peak MiB before/after with `instrument diff`")


def advise(snap: Snapshot, top: int = 3, th: Optional[Mapping[str, float]] = None) -> List[Dict[str, Any]]:
    """The `top` stages by self time, each with its verdict, the next step and
    the most removing its self time could save end to end (an upper bound)."""
    judged = with_verdicts(snap, th)
    end_to_end = judged.total_ns
    rows = sorted((s for s in judged if s.calls and not s.other), key=lambda s: -s.wall_self)[:top]
    views = {v.stage[0]: v for v in tail(snap)} if snap.exemplars else {}
    out = []
    for s in rows:
        v = s.verdict
        tv = views.get(s.path[0])
        ex = next((e for e in tv.excess if e.path == s.path), None) if tv is not None else None
        slow = None
        if ex is not None and ex.share is not None and ex.share >= 0.01:   # its part of the slow calls' excess, and how
            slow = {"share": ex.share, "excess_ns": ex.ns, "component": ex.component,
                    "component_ns": ex.parts.get(ex.component) if ex.component else None,
                    "text": f"{ex.share:.0%} of the slow calls' excess over a typical one"
                            + (f", most of it {PART_TEXT[ex.component]}" if ex.component else "")}
        out.append({"path": list(s.path), "self_ns": s.wall_self, "verdict": v["verdict"], "reason": v["reason"],
                    "evidence": v["evidence"], "limited_by": v["limited_by"],
                    "next": NEXT_STEP[v["verdict"]].format(name=s.name), "tail": slow, "memory": v.get("memory"),
                    "memory_next": FRESH_MEMORY_STEP if v.get("memory") else None,
                    "saving_upper_bound": s.wall_self / end_to_end if end_to_end else None})
    return out
