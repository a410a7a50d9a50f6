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


@pytest.fixture(params=["native", "pure"])
def backend(request):
    """Runs the test once against the C extension and once against the pure-Python twin."""
    mod = BACKENDS[request.param]
    if mod is None:
        pytest.skip("C extension not built")
    old = live_backend.current
    _collector.use_backend(mod)
    instrument.reset()
    yield mod
    instrument.reset()
    _collector.use_backend(old)


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


HOG = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


@pytest.fixture
def shared_core():
    """This process and a CPU hog pinned to one core (the scheduler shares it between them); the process's
    affinity is given back afterwards."""
    import subprocess
    import time
    old = os.sched_getaffinity(0)
    core = min(old)
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(core)])
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.05)   # the hog runs
        yield core
    finally:
        os.sched_setaffinity(0, old)
        hog.kill()
        hog.wait()


def run_delay_ns():
    """This thread's run-queue wait so far, as the kernel counts it (/proc/thread-self/schedstat, field 2)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1])
