"""Options: configure() refuses bad values at the call site; the environment is read in one place."""
import os
import subprocess
import sys

import pytest

import instrument
from instrument import config
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


def test_env_warnings_point_at_the_users_import_and_name_the_closest_variable(tmp_path):
    app = tmp_path / "app.py"
    app.write_text("import os\nimport instrument\nfrom instrument import config\nconfig.from_env()\n"
                   "print(instrument.current_config().overhead_budget)\n")
    r = subprocess.run([sys.executable, "-W", "default", str(app)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, INSTRUMENT_OVERHEAD_BUGDET="none", INSTRUMENT_MAX_STAGES="lots",
                                INSTRUMENT_ZZZ="1"))
    assert r.returncode == 0 and r.stdout.strip() == "0.01", r.stderr   # the misspelled option changed nothing
    warned = [l for l in r.stderr.splitlines() if "RuntimeWarning" in l]
    typo = [l for l in warned if "INSTRUMENT_OVERHEAD_BUGDET" in l]
    assert typo == [f"{app}:2: RuntimeWarning: instrument: unknown variable INSTRUMENT_OVERHEAD_BUGDET is ignored; "
                    "did you mean INSTRUMENT_OVERHEAD_BUDGET?"]      # once, though read twice
    assert any(l.startswith(f"{app}:2: ") and "INSTRUMENT_ZZZ is ignored; the variables are listed" in l
               for l in warned)
    bad = [l for l in warned if "INSTRUMENT_MAX_STAGES must be" in l]
    assert bad and bad[0].startswith(f"{app}:2: RuntimeWarning")     # the user's import, not instrument/...
    assert not [l for l in warned if "/instrument/" in l.split(": RuntimeWarning")[0]]
    known = set(config.known_variables())
    assert {o.env for o in config.OPTIONS if o.env} <= known and "INSTRUMENT_PURE_PYTHON" in known


def test_pure_python_forced_by_env():
    r = run_python("import instrument.live.backend as b; print(b.name)", env={"INSTRUMENT_PURE_PYTHON": "1"})
    assert r.stdout.strip() == "pure"


@pytest.mark.parametrize("value,parsed", [
    ("9464", "127.0.0.1:9464"), (":9464", "127.0.0.1:9464"), ("127.0.0.1:9464", "127.0.0.1:9464"),
    (" localhost:80 ", "localhost:80"), ("[::1]:9", "[::1]:9"), (9464, "127.0.0.1:9464"), ("", None), (None, None)])
def test_serve_values(value, parsed):
    from instrument import config
    assert config.defaults().replace(serve=value).serve == parsed


@pytest.mark.parametrize("value", ["x", "70000", "host:", "a b:1", "127.0.0.1:-1", True, 1.5])
def test_bad_serve_values_say_what_is_allowed(value):
    with pytest.raises(ValueError, match=r"serve must be host:port \(port 0 to 65535"):
        instrument.configure(serve=value)


def test_serve_refuses_other_hosts_unless_asked():
    from instrument import config
    for host in ("0.0.0.0", "10.1.2.3", "example.com", "[::]"):
        with pytest.raises(ValueError, match="is not a loopback address.*INSTRUMENT_SERVE_ANY_HOST=1"):
            config.defaults().replace(serve=f"{host}:9464")
        assert config.defaults().replace(serve_any_host=True, serve=f"{host}:9464").serve == f"{host}:9464"
    with pytest.warns(RuntimeWarning, match="INSTRUMENT_SERVE .* is not a loopback address"):
        assert config.from_env({"INSTRUMENT_SERVE": "0.0.0.0:1"}).serve is None
    with pytest.raises(ValueError, match="not a loopback address"):
        config.from_env({"INSTRUMENT_SERVE": "0.0.0.0:1"}, strict=True)
    assert config.from_env({"INSTRUMENT_SERVE": "0.0.0.0:1", "INSTRUMENT_SERVE_ANY_HOST": "1"}).serve == "0.0.0.0:1"


def test_the_option_table_of_the_docs_is_config_describe():
    import os
    from instrument import config
    docs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "configuration.md")
    text = open(docs, encoding="utf-8").read()
    assert config.describe() in text, "docs/configuration.md: paste the output of config.describe()"
    for o in config.OPTIONS:                      # every option and variable, as the parser knows them
        assert f"| `{o.name}` |" in text and (o.env is None or f"`{o.env}`" in text)
