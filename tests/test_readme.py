"""The README's Python examples run as written, and every top-level name it promises exists."""
import os
import re
import subprocess
import sys

import pytest

import instrument

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("k", range(len(BLOCKS)))
def test_readme_example_runs(k, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-c", BLOCKS[k]], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"README example {k + 1} failed:\n{BLOCKS[k]}\n{r.stderr}"


def test_top_level_names_exist():
    for name in ("stage", "region", "capture", "capture_every", "profile", "snapshot", "report", "configure",
                 "reset", "Snapshot", "serve_metrics", "diff"):
        assert callable(getattr(instrument, name)), name
        assert name in instrument.__all__
    for name in re.findall(r"`instrument\.([a-z_]+)\(", README):
        assert hasattr(instrument, name), f"README names instrument.{name}, which does not exist"
