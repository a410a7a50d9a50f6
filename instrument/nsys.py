"""Nsight Systems command lines that record only the steady-state capture window.

``build_command(["python", "serve.py"])`` gives::

    nsys profile -t cuda,nvtx,osrt -c nvtx -p steady@instrument --capture-range-end=stop \\
        -e <capture and warmup options as variables> -- python serve.py

``-c nvtx`` (``--capture-range=nvtx``) with ``-p NAME@DOMAIN`` (``--nvtx-capture``) starts
collection when the range opened by ``instrument.capture(NAME)`` begins; nsys
matches registered strings by default, which is what the capture range uses.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from typing import Mapping, Optional, Sequence, TextIO

from . import config

__all__ = ["build_command", "child_env", "run"]

_RANGE_END = re.compile(r"none|stop|stop-shutdown|repeat(:[1-9][0-9]*)?|repeat-shutdown:[1-9][0-9]*")


def child_env(warmup: int = 20, capture: str = "steady") -> dict:
    """The variables of the `capture` and `warmup` options that make the child's
    ``instrument.capture()`` open window ``capture`` after ``warmup`` iterations."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    _check_name("capture", capture)
    return config.to_env(capture=capture, warmup=warmup)


def _check_name(what: str, value) -> None:
    if not isinstance(value, str) or not value or any(c in value for c in "@,\n"):
        raise ValueError(f"{what} must be a non-empty str without '@', ',' or newlines, got {value!r}")


def build_command(argv: Sequence[str], capture: Optional[str] = "steady", domain: str = "instrument",
                  output: Optional[str] = None, trace: str = "cuda,nvtx,osrt",
                  capture_range_end: str = "stop", extra: Sequence[str] = (),
                  env: Optional[Mapping[str, str]] = None) -> list:
    """``nsys profile`` argv for running ``argv`` with collection limited to the NVTX range
    ``capture`` in ``domain`` (``capture=None``: the whole run). ``output`` is the report
    prefix (``-o``), ``extra`` goes before ``--``, ``env`` becomes ``-e K=V,...``."""
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError(f"argv must be a non-empty sequence of str, got {argv!r}")
    if not isinstance(trace, str) or not trace:
        raise ValueError(f"trace must be a non-empty str such as 'cuda,nvtx,osrt', got {trace!r}")
    if isinstance(extra, (str, bytes)) or not all(isinstance(a, str) for a in extra):
        raise TypeError(f"extra must be a sequence of str, got {extra!r}")
    cmd = ["nsys", "profile", "-t", trace]
    if capture is not None:
        _check_name("capture", capture)
        _check_name("domain", domain)
        if not isinstance(capture_range_end, str) or not _RANGE_END.fullmatch(capture_range_end):
            raise ValueError("capture_range_end must be one of none, stop, stop-shutdown, repeat[:N], "
                             f"repeat-shutdown:N; got {capture_range_end!r}")
        cmd += ["-c", "nvtx", "-p", f"{capture}@{domain}", f"--capture-range-end={capture_range_end}"]
    if output is not None:
        if not isinstance(output, str) or not output:
            raise ValueError(f"output must be a non-empty str (report path prefix), got {output!r}")
        cmd += ["-o", output]
    if env:
        for k, v in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)) or "," in str(v):
                raise ValueError(f"env entries must be NAME=value without ',' in the value, got {k!r}={v!r}")
        cmd += ["-e", ",".join(f"{k}={v}" for k, v in env.items())]
    return cmd + list(extra) + ["--"] + list(argv)


def run(argv: Sequence[str], dry_run: bool = False, warmup: int = 20, capture: str = "steady",
        domain: str = "instrument", output: Optional[str] = None, trace: str = "cuda,nvtx,osrt",
        capture_range_end: str = "stop", extra: Sequence[str] = (), file: Optional[TextIO] = None) -> int:
    """Print the nsys command (shell-quoted) and run it when nsys is on PATH.

    Returns nsys's exit status, or 0 for ``dry_run`` and when nsys is not found (the
    command is then printed for copying to a machine that has it)."""
    file = file or sys.stdout
    cmd = build_command(argv, capture=capture, domain=domain, output=output, trace=trace,
                        capture_range_end=capture_range_end, extra=extra, env=child_env(warmup, capture))
    line = shlex.join(cmd)
    if dry_run:
        print(line, file=file)
        return 0
    exe = shutil.which("nsys")
    if exe is None:
        print(f"nsys is not on PATH; run this where Nsight Systems is installed:\n  {line}", file=file)
        return 0
    print(line, file=file, flush=True)
    return subprocess.call([exe] + cmd[1:])
