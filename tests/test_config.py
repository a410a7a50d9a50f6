"""Options: configure() refuses bad values at the call site; the environment is read in one place."""
import pytest

import instrument
from instrument.snapshot import Snapshot
from conftest import run_python


# ----------------------------------------------------------- configuration
def test_configure_rejects_unknown_and_bad_values():
    with pytest.raises(TypeError, match="unknown option colour; the options are: enabled"):
        instrument.configure(colour=1)
    with pytest.raises(ValueError, match="max_stages must be an integer from 1"):
        instrument.configure(max_stages=0)
    with pytest.raises(ValueError, match="enabled must be a boolean"):
        instrument.configure(enabled="perhaps")


def test_env_disable_and_output(tmp_path):
    out = tmp_path / "o.json"
    code = "import instrument\nwith instrument.stage('a'):\n    pass\n"
    r = run_python(code, env={"INSTRUMENT_OUTPUT": str(out)})
    assert r.returncode == 0, r.stderr
    assert Snapshot.load(out)["a"].calls == 1
    r = run_python(code, env={"INSTRUMENT_OUTPUT": str(out), "INSTRUMENT_DISABLE": "1"})
    assert r.returncode == 0
    assert len(Snapshot.load(out)) == 0


def test_bad_env_value_names_variable_and_keeps_running():
    r = run_python("import instrument\nwith instrument.stage('a'): pass\nprint(instrument.current_config().max_stages)",
                   env={"INSTRUMENT_MAX_STAGES": "lots"})
    assert r.returncode == 0
    assert "INSTRUMENT_MAX_STAGES must be an integer from 1" in r.stderr and "using the default" in r.stderr
    assert r.stdout.strip() == "10000"
    from instrument import config
    with pytest.raises(ValueError, match="INSTRUMENT_TRACE_EVENTS must be an integer"):
        config.from_env({"INSTRUMENT_TRACE_EVENTS": "-1"}, strict=True)


def test_pure_python_forced_by_env():
    r = run_python("import instrument.live.backend as b; print(b.name)", env={"INSTRUMENT_PURE_PYTHON": "1"})
    assert r.stdout.strip() == "pure"
