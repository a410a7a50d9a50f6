"""Opening counters on this machine: the probe (C and ctypes groups), the ctypes
fallback, an import that does no I/O, and `instrument doctor`."""
import errno
import json
import os
import subprocess
import sys

import pytest

from instrument.counters import DEFAULT, describe_errno
from instrument.live import doctor, perf, perf_ctypes

try:
    from instrument import _native
    _native.CounterGroup
except (ImportError, AttributeError):  # extension not built, or built without csrc/perf.c
    _native = None

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_CORE_PMU = any(os.path.exists("/sys/bus/event_source/devices/" + n) for n in ("cpu", "cpu_core", "armv8_pmuv3"))


@pytest.fixture(params=["native", "ctypes"])
def backend(request, monkeypatch):
    if request.param == "native":
        if _native is None:
            pytest.skip("instrument._native is not built (python setup.py build_ext --inplace)")
        cls = _native.CounterGroup
    else:
        cls = perf_ctypes.CounterGroup
    monkeypatch.setattr(perf, "counter_group_class", lambda: cls)
    return request.param


# ---------------------------------------------------------------- probe and doctor

def test_probe(backend):
    p = perf.probe()
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
    p = perf.probe(["task-clock", "context-switches"], exclude_kernel=True)
    assert p["exclude_kernel"] is True
    assert p["events"]["task-clock"]["reason"] == "ok"
    cs = p["events"]["context-switches"]
    assert cs["available"] is True and "counts 0" in cs["reason"] and "perf_event_paranoid" in cs["fix"]


def test_probe_rejects_unknown_names():
    with pytest.raises(ValueError):
        perf.probe(["nope"])


def test_ctypes_used_without_extension():
    script = ("import sys, json; sys.modules['instrument._native'] = None; sys.path.insert(0, %r)\n"
              "from instrument.live import perf\n"
              "p = perf.probe(['task-clock', 'page-faults'])\n"
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
import instrument.counters, instrument.live.doctor, instrument.live.perf_ctypes
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
    from instrument.live import nvtx
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
    if d["torch"].get("version"):   # the stage range mechanism in force, from torch_profiler.status()
        assert d["torch"]["range"] and "stage ranges: %s" % d["torch"]["range"] in text


def test_capabilities_parse(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t%016x\n" % (1 << 38))
    assert doctor.capabilities(str(status)) == {"CapEff": "%016x" % (1 << 38), "CAP_PERFMON": True,
                                                "CAP_SYS_ADMIN": False}
    assert doctor.capabilities(str(tmp_path / "missing"))["CAP_PERFMON"] is None


@pytest.mark.native_only   # run-queue time, switch detection, helper-thread CPU: the C core's
def test_doctor_says_which_sources_of_the_wall_time_split_work(backend):
    """Run-queue time, switch detection and helper-thread CPU, each with its source or why it has none; the
    run-queue line agrees with this thread's own /proc/thread-self/schedstat."""
    from instrument import cli
    d = doctor.collect()
    text = doctor.format_text(d)
    lines = {line[:18].strip(): line[18:] for line in text.splitlines() if not line.startswith("  ")}
    with open("/proc/thread-self/schedstat") as f:
        on_cpu = int(f.read().split()[0])
    if on_cpu:
        assert lines["run-queue time"] == d["overhead"]["run_queue"] == "/proc/thread-self/schedstat"
    else:
        assert "schedstat reads 0 0" in lines["run-queue time"]
    assert lines["switch detection"] == d["overhead"]["switches"] and lines["switch detection"]
    assert lines["helper-thread CPU"] == d["overhead"]["helper_cpu"]
    if d["instrument"]["backend"] == "native":   # other threads' clocks: never the reader's own, nor the process's
        assert d["overhead"]["helper_cpu"].startswith("each helper thread's own CPU clock")
        if "perf task-clock" in d["sources"]["cpu time"]["source"]:   # perf_event_open allowed: nothing updates it
            assert not any(v["updates_scheduler"] for v in d["sources"].values()), d["sources"]
            assert lines["read: cpu time"].startswith("perf task-clock")
    else:
        assert d["overhead"]["helper_cpu"] == "process CPU clock less the threads that run stages"
    res = subprocess.run([sys.executable, "-m", "instrument", "doctor", "--json"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    assert res.returncode == 0, res.stderr
    assert {"run_queue", "switches", "helper_cpu"} <= set(json.loads(res.stdout)["overhead"])
