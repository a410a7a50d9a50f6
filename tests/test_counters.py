"""The perf_event catalogue: spec parsing, errno meanings, derived ratios (no I/O)."""
import errno
import os

import pytest

from instrument.counters import DEFAULT, EVENTS, derived, describe_errno, parse_counters, resolve

# ---------------------------------------------------------------- catalogue and parsing

def test_catalogue():
    assert EVENTS["cycles"] == (0, 0, "hardware")
    assert EVENTS["branch-misses"] == (0, 5, "hardware")
    assert EVENTS["task-clock"] == (1, 1, "software")
    assert EVENTS["cpu-migrations"] == (1, 4, "software")
    assert set(DEFAULT) == {"cycles", "instructions", "cache-references", "cache-misses", "branches",
                            "branch-misses", "task-clock", "page-faults", "context-switches", "cpu-migrations"}
    assert resolve("r1a8") == (4, 0x1A8, "hardware")
    assert resolve("rFF") == (4, 0xFF, "hardware")
    with pytest.raises(KeyError):
        resolve("rxyz")


def test_parse_counters_forms():
    assert parse_counters("default") == DEFAULT
    assert parse_counters(None) == DEFAULT
    assert parse_counters("none") == []
    assert parse_counters("") == []
    assert parse_counters("task-clock, page-faults,task-clock") == ["task-clock", "page-faults"]
    assert parse_counters(["cycles", "r1a8", "cycles"]) == ["cycles", "r1a8"]
    assert parse_counters("page-faults,default")[:2] == ["page-faults", "cycles"]
    assert len(parse_counters("page-faults,default")) == len(DEFAULT)


def test_parse_counters_unknown_lists_known():
    with pytest.raises(ValueError) as e:
        parse_counters("cycles,cylces,page-faults")
    msg = str(e.value)
    assert "'cylces'" in msg
    for name in DEFAULT:
        assert name in msg
    with pytest.raises(ValueError, match="'bogus', 'r'"):
        parse_counters(["bogus", "r"])


# ---------------------------------------------------------------- errno meanings

def test_describe_errno_meanings():
    reason, fix = describe_errno(errno.ENOENT, "hardware")
    assert "no such event on this PMU" in reason and fix == "-cpu host for KVM, or run on bare metal"
    reason, fix = describe_errno(errno.EOPNOTSUPP, "hardware")
    assert "PMU" in reason and fix == "-cpu host for KVM, or run on bare metal"
    for err in (errno.EACCES, errno.EPERM):
        reason, fix = describe_errno(err, "software")
        assert "perf_event_paranoid" in reason
        assert "sysctl kernel.perf_event_paranoid=1" in fix and "--cap-add PERFMON" in fix
    assert "seccomp" in describe_errno(errno.EPERM, "hardware")[0]
    assert "file descriptors" in describe_errno(errno.EMFILE, "software")[0]
    assert "seccomp" in describe_errno(errno.ENOSYS, "software")[0]
    assert "configuration" in describe_errno(errno.EINVAL, "hardware")[0]
    assert describe_errno(0, "software") == ("ok", None)
    assert describe_errno(errno.EXDEV, "software") == (os.strerror(errno.EXDEV), None)


# ------------------------------------------------------------------------ ratios
def test_derived_ratios():
    c = {"cycles": 4000, "instructions": 10000, "cache-references": 500, "cache-misses": 50,
         "branches": 2000, "branch-misses": 40, "task-clock": 3_000_000}
    d = derived(c, wall_ns=6_000_000)
    assert d["ipc"] == 2.5
    assert d["cache_miss_ratio"] == 0.1
    assert d["mpki"] == 5.0
    assert d["branch_miss_ratio"] == 0.02
    assert d["branch_miss_rate"] == 0.004
    assert d["cpu_utilisation"] == 0.5


def test_derived_missing_and_zero():
    d = derived({"task-clock": None, "cycles": 0, "instructions": 10, "cache-misses": 3}, wall_ns=0)
    assert d == {"ipc": None, "cache_miss_ratio": None, "mpki": 300.0, "branch_miss_ratio": None,
                 "branch_miss_rate": None, "cpu_utilisation": None}
    assert derived({}, wall_ns=100, cpu_ns=25)["cpu_utilisation"] == 0.25
    assert derived({"task-clock": 50}, wall_ns=100, cpu_ns=25)["cpu_utilisation"] == 0.5


def test_derived_is_ratio_of_sums():
    stages = [{"instructions": 100, "cycles": 100}, {"instructions": 900, "cycles": 100}]
    total = {k: sum(s[k] for s in stages) for k in stages[0]}
    assert derived(total, wall_ns=1)["ipc"] == 5.0  # not the mean of 1.0 and 9.0
