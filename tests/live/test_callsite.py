"""Warnings point at the user's line, not at the SDK's insides."""
import re
import sys
import textwrap

import pytest

from instrument.live import perf
from conftest import run_python

SCRIPT = textwrap.dedent("""\
    import instrument
    a, b = instrument.stage("a"), instrument.stage("b")
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)          # line 5: out of order
    b.__exit__(None, None, None)
    instrument.configure(counters="cycles")   # line 7: asked for by name
    instrument.snapshot()
""")


@pytest.mark.parametrize("pure", ["0", "1"])
def test_warnings_name_the_users_line(tmp_path, pure):
    script = tmp_path / "user_code.py"
    script.write_text(SCRIPT)
    r = run_python(f"import runpy, sys; sys.argv = [{str(script)!r}]; runpy.run_path({str(script)!r})",
                   env={"INSTRUMENT_PURE_PYTHON": pure, "PYTHONWARNINGS": "always"})
    assert r.returncode == 0, r.stderr
    sites = re.findall(r"^(.*?):(\d+): RuntimeWarning: instrument: (.*)$", r.stderr, re.M)
    order = [(f, int(n)) for f, n, m in sites if "inner stage was still open" in m or "out of order" in m]
    assert order == [(str(script), 5)], r.stderr
    if not perf.probe(["cycles"])["events"]["cycles"]["available"]:
        counters = [(f, int(n)) for f, n, m in sites if m.startswith("perf counters unavailable")]
        assert counters == [(str(script), 7)], r.stderr


def test_counter_warning_at_import_names_the_import_line(tmp_path):
    if perf.probe(["cycles"])["events"]["cycles"]["available"]:
        pytest.skip("cycles can be counted here: no warning to place")
    script = tmp_path / "serve.py"
    script.write_text("import os\nimport instrument\n")
    r = run_python(f"import runpy; runpy.run_path({str(script)!r})",
                   env={"INSTRUMENT_COUNTERS": "cycles", "PYTHONWARNINGS": "always"})
    assert r.returncode == 0, r.stderr
    sites = re.findall(r"^(.*?):(\d+): RuntimeWarning: instrument: perf counters unavailable", r.stderr, re.M)
    assert sites == [(str(script), "2")], r.stderr
