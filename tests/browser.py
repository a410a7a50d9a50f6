"""Headless chromium for the tests of the HTML report: the page as a browser renders it."""
import os
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def chromium():
    """Debian's chromium, installed with apt-get once when missing."""
    exe = shutil.which("chromium")
    if exe is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
            subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired):
            pass
        exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("chromium is not installed and `apt-get install -y chromium` could not install it")
    return exe


def browse(chromium, page, tmp_path, what):
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900"]
    if what == "dom":
        args.append("--dump-dom")
    else:
        args.append(f"--screenshot={what}")
    r = subprocess.run(args + [page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout
