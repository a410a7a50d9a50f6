import os
import sys

import pytest

import instrument
from instrument.live import backend as live_backend, collector as _collector, pure as _pure

try:
    from instrument import _native
except ImportError:  # reported by test_native_extension_is_built
    _native = None

BACKENDS = {"native": _native, "pure": _pure}


def pytest_configure(config):
    config.addinivalue_line("markers", "native_only: a test of what only the C core records (estimates, the overhead "
                            "budget, task attribution, exemplars, the probe, calibration): its `backend` is native only")


def pytest_collection_modifyitems(config, items):
    """A native_only test runs on the C extension alone: its pure-Python run is deselected."""
    pure = [i for i in items if i.get_closest_marker("native_only")
            and getattr(getattr(i, "callspec", None), "params", {}).get("backend") == "pure"]
    if pure:
        config.hook.pytest_deselected(items=pure)
        items[:] = [i for i in items if i not in pure]


def _recording_with(mod):
    old = live_backend.current
    _collector.use_backend(mod)
    instrument.reset()
    yield mod
    instrument.reset()
    _collector.use_backend(old)


@pytest.fixture(params=["native", "pure"])
def backend(request):
    """Runs the test once against the C extension and once against the pure-Python fallback (marked native_only:
    against the C extension only)."""
    mod = BACKENDS[request.param]
    if mod is None:
        pytest.skip("C extension not built")
    yield from _recording_with(mod)


@pytest.fixture
def fallback():
    """Records through the pure-Python fallback."""
    yield from _recording_with(_pure)


# the shares of its own time a verdict prints, by part of the split (docs/verdicts.md: one denominator)
PRINTED_SHARES = {"runqueue": r"\(run queue\) (\d+)%|in the run queue (\d+)%", "on_cpu": r"on a CPU (\d+)%",
                  "blocked": r"blocked (\d+)%", "awaiting": r"awaiting, (\d+)%", "loop_ready": r"event loop (\d+)%",
                  "instrument": r"^(\d+)% of its own time is instrument", "gil": r"take the GIL (\d+)%"}


def printed_shares(reason):
    import re
    out = {}
    for part, pat in PRINTED_SHARES.items():
        m = re.search(pat, reason)
        if m:
            out[part] = int(next(g for g in m.groups() if g))
    return out


def check_verdict_shares(v):
    """A verdict's shares of the own time (evidence and printed) are of one denominator and add up to at most 100 %."""
    split = v["evidence"].get("split", {})
    assert sum(split.values()) <= 1.0 + 1e-3 * len(split), v
    printed = printed_shares(v["reason"])
    assert sum(printed.values()) <= 100 + len(printed), v
    for part, pct in printed.items():
        assert abs(pct - 100 * split.get(part, 0)) <= 1, (part, v)


@pytest.fixture(autouse=True)
def _verdicts_add_up(monkeypatch):
    """Every verdict a test of this suite produces in its own process is walked: its shares add up.  Each is
    judged as its snapshot is made (verdicts are otherwise judged when first read), so none goes unwalked."""
    from instrument.analysis import verdict
    made, judge = [], verdict.judge

    def walked(*args, **kwargs):
        v = judge(*args, **kwargs)
        made.append(v)
        return v

    def at_once(self, judge_it):
        self._judge, self._value = None, judge_it()
    monkeypatch.setattr(verdict, "judge", walked)
    monkeypatch.setattr(verdict.Pending, "__init__", at_once)
    yield
    for v in made:
        check_verdict_shares(v)


@pytest.fixture(autouse=True)
def _fresh():
    cfg = _collector.current_config()
    instrument.reset()
    yield
    _collector._config_now = cfg
    _collector._apply(cfg)
    instrument.reset()


def run_python(code, env=None, timeout=120, cwd=None):
    """Run `code` in a fresh interpreter (for exit-time and environment behaviour)."""
    import subprocess
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def spin_ns(ns):
    """Burn `ns` of this thread's CPU; returns the thread CPU time it measured itself."""
    import time
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < ns:
        pass
    return time.thread_time_ns() - t0


HOG = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def _pinned_beside(code):
    """This process and a process running `code` (given the core) pinned to one core; the process's affinity is
    given back afterwards."""
    import subprocess
    import time
    old = os.sched_getaffinity(0)
    core = min(old)
    other = subprocess.Popen([sys.executable, "-c", code, str(core)])
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.05)   # the other process runs
        yield core
    finally:
        os.sched_setaffinity(0, old)
        other.kill()
        other.wait()


@pytest.fixture
def shared_core():
    """This process and a CPU hog pinned to one core (the scheduler shares it between them)."""
    yield from _pinned_beside(HOG)


NOW_AND_THEN = """import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
while True:
    t = time.perf_counter() + 0.0003
    while time.perf_counter() < t:
        pass
    time.sleep(0.0047)
"""


@pytest.fixture
def core_shared_now_and_then():
    """This process pinned to one core with a process that wakes every 5 ms and spins for 0.3 ms there: each
    wake preempts whatever call runs (a lightly loaded machine's preemptions: a few in a hundred ms)."""
    yield from _pinned_beside(NOW_AND_THEN)


@pytest.fixture
def hog_per_core():
    """A CPU hog pinned to each core this process may use, as a busy shared machine has."""
    import subprocess
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(c)]) for c in sorted(os.sched_getaffinity(0))]
    try:
        yield len(hogs)
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def steal_ns():
    """The hypervisor's steal time so far, every CPU of the machine summed (/proc/stat): time a vCPU was not run
    while its guest thread stayed scheduled.  perf's task-clock counts it as the thread's time (it runs on the local
    clock while the thread is scheduled in), CLOCK_THREAD_CPUTIME_ID does not: a stage's CPU time read from
    task-clock may exceed a thread clock's by as much as the steal in between, and by no more."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0


def run_delay_ns():
    """This thread's run-queue wait so far, as the kernel counts it (/proc/thread-self/schedstat, field 2)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1])
