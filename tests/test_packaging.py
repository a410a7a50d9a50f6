"""What pyproject.toml ships and under which name: the README installs the distribution pyproject names (not
the registry's unrelated `instrument`), with extras that exist; every package of the tree is found and every
package-data pattern matches a file. `.ci/wheel` checks the built wheel itself."""
import glob
import os
import re

import pytest
import setuptools

try:
    import tomllib
except ImportError:   # Python < 3.11
    tomllib = pytest.importorskip("tomli")

import instrument

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    PYPROJECT = tomllib.load(f)
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
NAME = PYPROJECT["project"]["name"]


def test_the_readme_installs_the_distribution_pyproject_names():
    assert NAME == "instrument-sdk"   # `instrument` on the registry is an unrelated 2018 project
    first_screen = README[:README.index("\n## ")]
    installs = re.findall(r"^    pip install ['\"]?([A-Za-z0-9_.-]+)", first_screen, re.M)
    assert installs and set(installs) == {NAME}, installs
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    named = re.findall(r"pip install (?:-e )?['\"]?[A-Za-z0-9_.-]+\[([a-z,]+)\]", README)
    assert len(named) >= 3 and set(",".join(named).split(",")) <= extras, named


def test_messages_that_say_what_to_install_name_the_distribution():
    offenders = []
    for path in glob.glob(os.path.join(ROOT, "instrument", "**", "*.py"), recursive=True):
        text = open(path, encoding="utf-8").read()
        offenders += [(os.path.relpath(path, ROOT), m) for m in re.findall(r"pip install ['\"]?([a-z_-]+)\[", text)
                      if m != NAME]
    assert offenders == []


def test_the_version_is_written_once():
    assert "version" in PYPROJECT["project"]["dynamic"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "instrument._version.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", instrument.__version__)


def test_every_package_of_the_tree_is_found():
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    found = set(setuptools.find_packages(ROOT, include=find["include"]))
    in_tree = {os.path.relpath(d, ROOT).replace(os.sep, ".")
               for d, _, files in os.walk(os.path.join(ROOT, "instrument")) if "__init__.py" in files}
    assert "instrument.auto" in in_tree and found == in_tree


def test_every_package_data_pattern_matches_a_file():
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        for pattern in patterns:
            assert glob.glob(os.path.join(ROOT, *package.split("."), pattern)), f"{package}: {pattern}"


def test_the_tests_import_this_checkout():
    """An install under another distribution name (`instrument`, the old one) would shadow this checkout."""
    assert os.path.dirname(os.path.abspath(instrument.__file__)) == os.path.join(ROOT, "instrument"), instrument.__file__
