"""perf_event catalogue, spec parsing, errno meanings and derived ratios.

Pure data and arithmetic: no I/O (opening events is instrument.live.perf).
"""
import errno as _errno
import os
import re

__all__ = ["EVENTS", "DEFAULT", "KERNEL_CONTEXT_EVENTS", "PERM_FIX", "resolve", "parse_counters", "describe_errno",
           "derived"]

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_RAW = 0, 1, 4

#: name -> (perf_event_attr.type, .config, kind)
EVENTS = {
    "cycles": (PERF_TYPE_HARDWARE, 0, "hardware"),
    "instructions": (PERF_TYPE_HARDWARE, 1, "hardware"),
    "cache-references": (PERF_TYPE_HARDWARE, 2, "hardware"),
    "cache-misses": (PERF_TYPE_HARDWARE, 3, "hardware"),
    "branches": (PERF_TYPE_HARDWARE, 4, "hardware"),
    "branch-misses": (PERF_TYPE_HARDWARE, 5, "hardware"),
    "ref-cycles": (PERF_TYPE_HARDWARE, 9, "hardware"),
    "cpu-clock": (PERF_TYPE_SOFTWARE, 0, "software"),
    "task-clock": (PERF_TYPE_SOFTWARE, 1, "software"),
    "page-faults": (PERF_TYPE_SOFTWARE, 2, "software"),
    "context-switches": (PERF_TYPE_SOFTWARE, 3, "software"),
    "cpu-migrations": (PERF_TYPE_SOFTWARE, 4, "software"),
    "minor-faults": (PERF_TYPE_SOFTWARE, 5, "software"),
    "major-faults": (PERF_TYPE_SOFTWARE, 6, "software"),
    "alignment-faults": (PERF_TYPE_SOFTWARE, 7, "software"),
    "emulation-faults": (PERF_TYPE_SOFTWARE, 8, "software"),
}

DEFAULT = ["cycles", "instructions", "cache-references", "cache-misses", "branches", "branch-misses",
           "task-clock", "page-faults", "context-switches", "cpu-migrations"]

#: counted only in kernel context: they read 0 whenever the kernel is excluded (perf's ``cs:u``)
KERNEL_CONTEXT_EVENTS = frozenset({"context-switches", "cpu-migrations"})

_RAW = re.compile(r"^r([0-9a-fA-F]{1,16})$")


def resolve(name):
    """(type, config, kind) of a catalogue name or a raw ``r<hex>`` event; KeyError if unknown."""
    if name in EVENTS:
        return EVENTS[name]
    m = _RAW.match(name)
    if m:
        return (PERF_TYPE_RAW, int(m.group(1), 16), "hardware")
    raise KeyError(name)


def parse_counters(spec):
    """Counter names from "default", "none", "a,b,c" or a list (items may be "default").

    None means "default".  Unknown names raise ValueError naming them and listing the known ones;
    duplicates are dropped, first occurrence kept.
    """
    if spec is None:
        spec = "default"
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out, bad = [], []
    for item in items:
        if not isinstance(item, str):
            raise TypeError("counter names must be strings, got %r" % (item,))
        name = item.strip()
        if not name or name == "none":
            continue
        for n in DEFAULT if name == "default" else [name]:
            try:
                resolve(n)
            except KeyError:
                bad.append(n)
                continue
            if n not in out:
                out.append(n)
    if bad:
        raise ValueError("unknown counter%s %s; known: %s, default, none, or raw r<hex>" % (
            "s" if len(bad) > 1 else "", ", ".join(repr(b) for b in bad), ", ".join(EVENTS)))
    return out


_NO_PMU_FIX = "-cpu host for KVM, or run on bare metal"
PERM_FIX = "sysctl kernel.perf_event_paranoid=1, or grant CAP_PERFMON (docker: --cap-add PERFMON)"


def describe_errno(err, event_kind="hardware"):
    """(reason, fix) for a perf_event_open errno; fix is None when there is nothing to do."""
    if not err:
        return ("ok", None)
    hw = event_kind == "hardware"
    if err in (_errno.ENOENT, _errno.EOPNOTSUPP):
        if hw:
            return ("no such event on this PMU: no hardware PMU is exposed (a VM without a virtual PMU?)"
                    if err == _errno.ENOENT else
                    "the PMU does not support this event or mode (a VM without a virtual PMU?)", _NO_PMU_FIX)
        return ("this kernel does not know the software event", "use a newer kernel")
    if err == _errno.ENODEV:
        return ("the CPU or PMU lacks the feature this event needs", _NO_PMU_FIX if hw else None)
    if err == _errno.EACCES:
        return ("not permitted by kernel.perf_event_paranoid without CAP_PERFMON", PERM_FIX)
    if err == _errno.EPERM:
        return ("not permitted: perf_event_paranoid/CAP_PERFMON, or a seccomp profile refusing "
                "perf_event_open (docker's default)", PERM_FIX + ", or allow perf_event_open in the seccomp profile")
    if err == _errno.EMFILE:
        return ("out of file descriptors (RLIMIT_NOFILE): one fd per event per thread",
                "raise the limit (ulimit -n) or count fewer events")
    if err == _errno.ENFILE:
        return ("the system-wide file table is full", "raise fs.file-max")
    if err == _errno.ENOSYS:
        return ("perf_event_open is unavailable: kernel without CONFIG_PERF_EVENTS, or blocked by seccomp",
                "use a kernel with CONFIG_PERF_EVENTS, or allow perf_event_open in the seccomp profile")
    if err == _errno.EINVAL:
        return ("the kernel rejected the event configuration (unknown config or raw code, unsupported "
                "exclude bits, or a group constraint)", "check the event code against `perf list`")
    if err == _errno.EBUSY:
        return ("the counter is held exclusively by someone else (NMI watchdog, another profiler)",
                "sysctl kernel.nmi_watchdog=0, or stop the other profiler")
    if err == _errno.ENOSPC:
        return ("no room: too many counter groups or hardware breakpoints", "count fewer events")
    if err == _errno.E2BIG:
        return ("the kernel does not accept this perf_event_attr size", "use a newer kernel")
    if err == _errno.EOVERFLOW:
        return ("sample_max_stack above kernel.perf_event_max_stack", None)
    return (os.strerror(err), None)


def _ratio(num, den, factor=1):
    if num is None or not den:
        return None
    return num * factor / den


def derived(counters, wall_ns, cpu_ns=None):
    """Ratios of summed counters; None where an input is missing or a denominator is zero.

    cpu_ns stands in for task-clock when the counter is absent (e.g. thread_time deltas).
    """
    c = counters.get
    task = c("task-clock")
    if task is None:
        task = cpu_ns
    return {
        "ipc": _ratio(c("instructions"), c("cycles")),
        "cache_miss_ratio": _ratio(c("cache-misses"), c("cache-references")),
        "mpki": _ratio(c("cache-misses"), c("instructions"), 1000),
        "branch_miss_ratio": _ratio(c("branch-misses"), c("branches")),
        "branch_miss_rate": _ratio(c("branch-misses"), c("instructions")),
        "cpu_utilisation": _ratio(task, wall_ns),
    }
