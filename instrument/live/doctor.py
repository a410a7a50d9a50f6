"""What this host allows for perf_event counting, and why, for ``instrument doctor``.

:func:`collect` gathers facts into a plain dict; :func:`format_text` renders it.  The
``nvtx``, ``torch`` and ``cuda`` slots are left as None for their own collectors.
"""
import errno
import os
import platform
import shutil

from . import backend, collector, memory, nvtx, perf, tasks, torch_profiler

__all__ = ["collect", "format_text"]

MECHANISM_SHORT = tasks.MECHANISM

CAP_SYS_ADMIN, CAP_PERFMON = 21, 38
_PMU_DIR = "/sys/bus/event_source/devices"
_CORE_PMUS = ("cpu", "cpu_core", "cpu_atom")  # x86; arm64 core PMUs are named armv8_*/arm_*


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def capabilities(status_path="/proc/self/status"):
    """Effective CAP_PERFMON / CAP_SYS_ADMIN from CapEff, None where unreadable."""
    cap = None
    for line in (_read(status_path) or "").splitlines():
        if line.startswith("CapEff:"):
            cap = int(line.split()[1], 16)
    if cap is None:
        return {"CapEff": None, "CAP_PERFMON": None, "CAP_SYS_ADMIN": None}
    return {"CapEff": "%016x" % cap, "CAP_PERFMON": bool(cap >> CAP_PERFMON & 1),
            "CAP_SYS_ADMIN": bool(cap >> CAP_SYS_ADMIN & 1)}


def pmus(root=_PMU_DIR):
    """{pmu name: perf_event_attr.type} for every registered PMU."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return {}
    return {n: _int(_read(os.path.join(root, n, "type"))) for n in names}


def sources(cal):
    """Each quantity a read call takes: its source, and whether reading it updates the scheduler's accounting of
    the reading thread (which preempts a thread whose slice is spent right there, inside the SDK's read)."""
    cpu, clock, helpers = cal.get("cpu_source"), cal.get("thread_clock") or "", cal.get("helper_cpu") or ""
    cpu_src = {"task-clock": "perf task-clock in the counter group (read())", "thread-clock": clock}.get(cpu, "none")
    updates = lambda src: "CLOCK_THREAD_CPUTIME_ID" in src or "clock_gettime" in src or "process CPU clock" in src
    out = {"cpu time": cpu_src, "system time": "getrusage(RUSAGE_THREAD)" if cal.get("sys") else "off or unavailable",
           "run queue": cal.get("run_queue") or "off", "helper CPU": helpers or "off",
           "switches": cal.get("switches") or "off"}
    return {k: {"source": v, "updates_scheduler": updates(v)} for k, v in out.items()}


def collect(events=None):
    caps = capabilities()
    paranoid = _int(_read("/proc/sys/kernel/perf_event_paranoid"))
    found = pmus()
    core = [n for n in found if n in _CORE_PMUS or n.startswith(("armv8", "arm_cortex", "arm_neoverse"))]
    rdpmc_sysfs = {n: _int(_read(os.path.join(_PMU_DIR, n, "rdpmc"))) for n in core
                   if _read(os.path.join(_PMU_DIR, n, "rdpmc")) is not None}
    d = {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "perf_event_paranoid": paranoid,
        "capabilities": caps,
        # the kernel's perfmon_capable(): CAP_PERFMON or CAP_SYS_ADMIN, else paranoid must be <= 1
        "kernel_counting_allowed": None if paranoid is None and caps["CapEff"] is None else
        bool(caps["CAP_PERFMON"] or caps["CAP_SYS_ADMIN"] or (paranoid is not None and paranoid <= 1)),
        "pmus": found,
        "core_pmus": core,
        "rdpmc_sysfs": rdpmc_sysfs,
        "perf_binary": shutil.which("perf"),
        "events": {}, "exclude_kernel": None, "rdpmc": None, "backend": None, "probe_error": None,
        "nvtx": None, "torch": None, "cuda": None, "tasks": None,
    }
    try:
        d.update(perf.probe(events))
    except Exception as exc:  # doctor reports, it does not fail
        d["probe_error"] = "%s: %s" % (type(exc).__name__, exc)
    d.update(_integrations())
    return d


def _integrations():
    """Backend, NVTX, torch and CUDA status (doctor may import torch; the SDK never does)."""
    import importlib.util
    import sys
    b = backend.describe()
    out = {"instrument": {"backend": b["name"], "reason": b["reason"], "missing": b["missing"],
                          "version": collector.__version__}}
    cfg = collector.current_config()
    out["nvtx"] = {"emitter": nvtx.backend(), "enabled": bool(cfg.nvtx), "domain": cfg.nvtx_domain,
                   "tool": os.environ.get("NVTX_INJECTION64_PATH") or None}
    out["tasks"] = tasks.status()
    cal = dict(collector.calibration())
    cal["budget"] = cfg.overhead_budget
    out["overhead"] = cal
    out["sources"] = sources(cal)
    out["gil_wait"] = backend.current.gil_status()
    out["memory"] = memory.status()
    if importlib.util.find_spec("torch") is None:
        out["torch"] = {"installed": False, "reason": "torch is not installed: profiler and GPU integration are off"}
        out["cuda"] = {"available": False, "reason": "needs torch"}
        return out
    try:
        import torch
        out["torch"] = {"installed": True, "version": torch.__version__, "imported_before_doctor": "torch" in sys.modules}
        out["torch"].update(torch_profiler.status())
        avail = bool(torch.cuda.is_available())
        out["cuda"] = {"available": avail, "version": torch.version.cuda,
                       "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if avail else [],
                       "reason": None if avail else ("CPU-only torch build" if torch.version.cuda is None
                                                     else "no CUDA device visible")}
    except Exception as exc:
        out["torch"] = {"installed": True, "reason": "import failed: %s" % exc}
        out["cuda"] = {"available": False, "reason": "torch import failed"}
    return out


def gil_text(g) -> str:
    """The GIL sampler in one line: its mechanism, rate and cost, or why it is off."""
    if g.get("enabled"):
        cost = g["sampler_cpu_ns"] / (g["seconds"] * 1e9) if g.get("seconds") else 0.0
        return ("%s; every %.1f ms while stages are open (%d samples so far), its CPU %.3f %% of one core so far "
                "(at most %.1f %%)" % (g["mechanism"], g["period_ns"] / 1e6, g["reads"], 100 * cost,
                                      100 * g["cpu_share_max"]))
    return "not measured (%s)" % (g.get("reason") or "the gil_wait option is off")


def memory_text(m) -> str:
    """The memory sources in one line: each one's name, how its peak is read and what a read costs, or why none."""
    srcs = [s for s in m.get("sources") or () if s.get("active")]
    if not srcs:
        return "not measured (%s)" % (m.get("reason") or "the memory option is none")
    return "; ".join("%s: %s, %.0f ns a read%s" % (s["name"], s["peak"], s["ns_per_read"],
                                                    " (stopped: %s)" % s["error"] if s.get("error") else "")
                     for s in srcs) + ("; cuda: %s" % m["cuda"] if m.get("cuda") else "")


def _yn(v):
    return "unknown" if v is None else ("yes" if v else "no")


def format_text(d):
    caps = d.get("capabilities") or {}
    pm = d.get("pmus") or {}
    lines = [
        "kernel            %s (%s)" % (d.get("kernel"), d.get("machine")),
        "perf_event_paranoid %s; CAP_PERFMON %s, CAP_SYS_ADMIN %s; kernel counting allowed: %s" % (
            d.get("perf_event_paranoid"), _yn(caps.get("CAP_PERFMON")), _yn(caps.get("CAP_SYS_ADMIN")),
            _yn(d.get("kernel_counting_allowed"))),
        "PMUs              %s" % (", ".join("%s=%s" % kv for kv in pm.items()) or "none"),
        "hardware PMU      %s" % (", ".join(d.get("core_pmus") or []) or "none (no core PMU registered)"),
        "counting          %s, backend %s, rdpmc %s" % (
            "user only (kernel excluded)" if d.get("exclude_kernel") else
            "user + kernel" if d.get("exclude_kernel") is not None else "unknown",
            d.get("backend"), _yn(d.get("rdpmc"))),
        "perf binary       %s" % (d.get("perf_binary") or "not on PATH"),
    ]
    if d.get("probe_error"):
        lines.append("probe failed      %s" % d["probe_error"])
    ins, nv, tc, cu = (d.get(k) or {} for k in ("instrument", "nvtx", "torch", "cuda"))
    if ins:
        lines.append("instrument        %s backend%s" % (ins.get("backend"), " (%s)" % ins["reason"] if ins.get("reason") else ""))
        if ins.get("missing"):
            lines.append("  lacks           %s (the C extension has them)" % "; ".join(ins["missing"]))
    if nv:
        lines.append("NVTX              %s, emitter %s, domain %r, tool %s" % (
            "on" if nv.get("enabled") else "off (the nvtx option)", nv.get("emitter"), nv.get("domain"),
            nv.get("tool") or "none attached (ranges cost a null check; run under nsys to record them)"))
    ov = d.get("overhead") or {}
    if ov.get("read_ns") is not None:
        lines.append("CPU time          from %s; thread clock: %s; system time: %s" % (
            ov.get("cpu_source"), ov.get("thread_clock", "clock_gettime"),
            "the thread's rusage" if ov.get("sys") else "off (cpu_split) or unavailable"))
    if ov.get("base_ns") is not None:
        budget = ov.get("budget")
        lines.append("overhead          a stage call %.0f ns; one call's reads %.0f ns (%.0f ns of them taken out of its "
                     "CPU time); %s" % (
                         ov.get("base_ns") or 0, ov["read_ns"], ov.get("cpu_bias_ns") or 0,
                         "every call read (overhead_budget none)" if not budget else
                         "budget %g %%: stages shorter than %.0f µs on average are read on a sample of calls" % (
                             budget * 100, ov["read_ns"] / budget / 1000)))
    if ov.get("run_queue"):
        rq = ov["run_queue"]
        lines.append("run-queue time    %s%s" % (rq, "" if rq == "/proc/thread-self/schedstat" else
                                                 "; the off-CPU time of a call stays unsplit (neither run queue nor "
                                                 "blocked is guessed), its involuntary switches remain the evidence"))
    if ov.get("switches"):
        lines.append("switch detection  %s" % ov["switches"])
    if ov.get("helper_cpu"):
        lines.append("helper-thread CPU %s" % ov["helper_cpu"])
    gil = d.get("gil_wait") or {}
    if gil:
        lines.append("GIL wait          %s" % gil_text(gil))
    if d.get("memory"):
        lines.append("memory            %s" % memory_text(d["memory"]))
    for name, src in (d.get("sources") or {}).items():   # a read that updates the scheduler can preempt inside it
        lines.append("%-18s%s: %s" % ("read: " + name, src["source"], "UPDATES THE SCHEDULER (can preempt the "
                                      "thread inside the read)" if src["updates_scheduler"] else "no scheduler update"))
    tk = d.get("tasks") or {}
    if tk:
        lines.append("asyncio           %s" % (
            "CPU time and counters per task (%s; Python %s); %s" % (tk.get("mechanism"), tk.get("python"),
                                                                    "hand-entered contexts: overlapped calls marked")
            if tk.get("installed") and not tk.get("reason") else
            "overlapped calls marked, their CPU time and counters left out (%s)" % tk.get("reason")
            if tk.get("reason") != "asyncio not imported yet" else
            "CPU time and counters per task once asyncio is imported (%s; Python %s)" % (MECHANISM_SHORT, tk.get("python"))))
    if tc:
        version = tc.get("version") if tc.get("installed") else None
        ranges = "; stage ranges: %s" % tc["range"] if tc.get("range") else ""
        lines.append("torch             %s" % ("%s%s" % (version, ranges) if version else tc.get("reason")))
    if cu:
        lines.append("CUDA              %s" % (", ".join(cu.get("devices") or []) if cu.get("available")
                                               else "unavailable: %s" % cu.get("reason")))
    events = d.get("events") or {}
    width = max([len(n) for n in events] + [8])
    for name, e in events.items():
        state = "ok" if e["available"] else "unavailable"
        line = "  %-*s %-11s %s" % (width, name, state, "" if e["reason"] == "ok" else e["reason"])
        if e.get("errno"):
            line += " [%s]" % errno.errorcode.get(e["errno"], e["errno"])
        if e.get("fix"):
            line += "; fix: %s" % e["fix"]
        lines.append(line.rstrip())
    return "\n".join(lines) + "\n"
