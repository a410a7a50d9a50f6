"""Catalogue, spec parsing, errno meanings, scaling, derived ratios, probe and doctor."""
import errno
import json
import os
import subprocess
import sys

import pytest

from instrument import _perf_ctypes, counters, doctor
from instrument.counters import DEFAULT, EVENTS, derived, describe_errno, parse_counters, resolve, scale

try:
    from instrument import _native
    _native.CounterGroup
except (ImportError, AttributeError):  # extension not built, or built without csrc/perf.c
    _native = None

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_CORE_PMU = any(os.path.exists("/sys/bus/event_source/devices/" + n) for n in ("cpu", "cpu_core", "armv8_pmuv3"))


@pytest.fixture(params=["native", "ctypes"])
def backend(request, monkeypatch):
    if request.param == "native":
        if _native is None:
            pytest.skip("instrument._native is not built (python setup.py build_ext --inplace)")
        cls = _native.CounterGroup
    else:
        cls = _perf_ctypes.CounterGroup
    monkeypatch.setattr(counters, "counter_group_class", lambda: cls)
    return request.param


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


# ---------------------------------------------------------------- scaling and ratios

def test_scale():
    assert scale(1000, 2000, 2000) == (1000, False)
    assert scale(1000, 2000, 1000) == (2000, True)   # ran half the time
    assert scale(1001, 3, 2) == (1502, True)         # 1501.5 rounds half up, exact ints
    assert scale(10**18, 10**12, 10**11) == (10**19, True)
    assert scale(0, 500, 0) == (None, False)         # never scheduled on the PMU
    assert scale(0, 0, 0) == (None, False)


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


# ---------------------------------------------------------------- probe and doctor

def test_probe(backend):
    p = counters.probe()
    assert p["backend"] == backend
    assert list(p["events"]) == DEFAULT
    for name in ("task-clock", "page-faults", "context-switches", "cpu-migrations"):
        assert p["events"][name]["available"] is True and p["events"][name]["errno"] is None
    if os.geteuid() == 0:
        assert p["exclude_kernel"] is False
        assert p["events"]["context-switches"]["reason"] == "ok"
    if not HAS_CORE_PMU:
        cyc = p["events"]["cycles"]
        assert cyc["available"] is False and cyc["errno"] in (errno.ENOENT, errno.EOPNOTSUPP)
        assert cyc["reason"] == describe_errno(cyc["errno"], "hardware")[0]
        assert cyc["fix"] == "-cpu host for KVM, or run on bare metal"
        assert p["rdpmc"] is False


def test_probe_user_only_flags_kernel_context_events(backend):
    p = counters.probe(["task-clock", "context-switches"], exclude_kernel=True)
    assert p["exclude_kernel"] is True
    assert p["events"]["task-clock"]["reason"] == "ok"
    cs = p["events"]["context-switches"]
    assert cs["available"] is True and "counts 0" in cs["reason"] and "perf_event_paranoid" in cs["fix"]


def test_probe_rejects_unknown_names():
    with pytest.raises(ValueError):
        counters.probe(["nope"])


def test_ctypes_used_without_extension():
    script = ("import sys, json; sys.modules['instrument._native'] = None; sys.path.insert(0, %r)\n"
              "from instrument import counters\n"
              "p = counters.probe(['task-clock', 'page-faults'])\n"
              "print(json.dumps([p['backend'], p['events']['task-clock']['available']]))") % REPO
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == ["ctypes", True]


IMPORT_AUDIT = """
import ctypes, sys  # ctypes dlopen()s the interpreter itself on import: not ours
sys.path.insert(0, %r)
seen = []
def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir", "subprocess.Popen", "ctypes.dlopen", "socket.connect"):
        seen.append((event, str(args[0])))
sys.addaudithook(hook)
import instrument.counters, instrument.doctor, instrument._perf_ctypes
# the import system itself lists sys.path entries and opens sources and caches
print([s for s in seen if not (s[0] == "os.listdir" or s[1].endswith((".py", ".pyc")))])
"""


def test_import_does_no_io():
    res = subprocess.run([sys.executable, "-c", IMPORT_AUDIT % REPO], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_doctor_collect_and_text(backend):
    d = doctor.collect()
    assert d["kernel"] == os.uname().release
    assert d["perf_event_paranoid"] == int(open("/proc/sys/kernel/perf_event_paranoid").read())
    assert d["pmus"]["software"] == 1
    assert set(d["capabilities"]) == {"CapEff", "CAP_PERFMON", "CAP_SYS_ADMIN"}
    from instrument import nvtx
    assert d["nvtx"]["emitter"] == nvtx.backend() and "installed" in d["torch"] and "available" in d["cuda"]
    assert d["backend"] == backend and d["probe_error"] is None
    assert list(d["events"]) == DEFAULT
    text = doctor.format_text(d)
    event_lines = [line.split() for line in text.splitlines() if line.startswith("  ")]
    assert [f[0] for f in event_lines] == DEFAULT
    for f in event_lines:
        assert f[1] == ("ok" if d["events"][f[0]]["available"] else "unavailable")
    if not HAS_CORE_PMU:
        assert "no core PMU" in text and "fix: -cpu host for KVM, or run on bare metal" in text


def test_capabilities_parse(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t%016x\n" % (1 << 38))
    assert doctor.capabilities(str(status)) == {"CapEff": "%016x" % (1 << 38), "CAP_PERFMON": True,
                                                "CAP_SYS_ADMIN": False}
    assert doctor.capabilities(str(tmp_path / "missing"))["CAP_PERFMON"] is None
