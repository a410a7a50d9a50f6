"""Opening perf_event counters on this machine: the group class in use and a probe of what works."""
from ..counters import KERNEL_CONTEXT_EVENTS, PERM_FIX, describe_errno, parse_counters, resolve


def counter_group_class():
    """The C CounterGroup when the extension is built, else the ctypes one."""
    try:
        from .._native import CounterGroup  # absent too when built without csrc/perf.c
    except ImportError:
        from .perf_ctypes import CounterGroup
    return CounterGroup


def probe(events=None, exclude_kernel=False):
    """Opens the events once on the calling thread, as one CounterGroup, and reports what worked.

    exclude_kernel=False asks for kernel counting the way perf does and reports whether the
    fallback to user-only was needed.  Returns::

        {"events": {name: {"available", "errno", "reason", "fix", "kind"}},
         "exclude_kernel": bool, "rdpmc": bool, "backend": "native" | "ctypes"}
    """
    names = parse_counters(events)
    cls = counter_group_class()
    specs = [resolve(n) for n in names]
    with cls([(t, c) for t, c, _ in specs], exclude_kernel=exclude_kernel) as group:
        status, excl, rdpmc = list(group.status), bool(group.exclude_kernel), bool(group.rdpmc)
    out = {}
    for name, (_, _, kind), err in zip(names, specs, status):
        reason, fix = describe_errno(err, kind)
        if not err and excl and name in KERNEL_CONTEXT_EVENTS:
            reason, fix = "opens, but counts 0: the kernel is excluded and it is counted in kernel context", PERM_FIX
        out[name] = {"available": not err, "errno": err or None, "reason": reason, "fix": fix, "kind": kind}
    return {"events": out, "exclude_kernel": excl, "rdpmc": rdpmc,
            "backend": "native" if cls.__module__ == "instrument._native" else "ctypes"}
