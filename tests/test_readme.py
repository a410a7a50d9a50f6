"""The README's Python examples run as written and print what their `# →` comments
say; its commands are the ones CI and the package know; it stays short."""
import os
import re
import subprocess
import sys

import pytest

import instrument
from instrument import cli
from instrument.analysis.advice import NEXT_STEP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_is_short_and_has_examples():
    assert len(README.splitlines()) <= 150
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("k", range(len(BLOCKS)))
def test_readme_example_runs_and_prints_what_it_says(k, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-c", BLOCKS[k]], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"README example {k + 1} failed:\n{BLOCKS[k]}\n{r.stderr}"
    promised = re.findall(r"^print\(.*#\s*→\s*(.*)$", BLOCKS[k], re.M)
    assert promised, f"README example {k + 1} promises no output"
    printed = r.stdout.splitlines()
    for line in promised:
        assert line.strip() in printed, f"README example {k + 1} should print {line.strip()!r}:\n{r.stdout}"


def test_the_commands_exist(capsys):
    assert '    pip install ".[demo]" && instrument demo\n' in README
    assert '    pip install -e ".[test]" && pytest\n' in README          # what .ci/run runs, character for character
    commands = set(re.findall(r"^    .*?\binstrument ([a-z]+)\b", README, re.M))
    assert commands >= {"demo", "report", "export", "run", "top"}
    for c in commands:
        assert cli.main([c, "--help"]) == 0, c
    capsys.readouterr()


def test_top_level_names_exist():
    for name in ("stage", "region", "capture", "capture_every", "profile", "snapshot", "report", "configure",
                 "reset", "Snapshot", "serve_metrics", "diff"):
        assert callable(getattr(instrument, name)), name
        assert name in instrument.__all__
    for name in re.findall(r"`?instrument\.([a-z_]+)\(", README):
        assert hasattr(instrument, name), f"README names instrument.{name}, which does not exist"


def test_the_verdict_list_names_every_verdict():
    listed = re.search(r"a verdict per stage\n?\((.*?);", README, re.S).group(1).split()
    judged = set(NEXT_STEP) - {"memory-bound?", "unknown"}     # a suspicion and the absence of data
    assert {v.strip(",") for v in listed} == judged
