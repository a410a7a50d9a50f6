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
