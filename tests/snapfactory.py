"""Snapshots with known numbers, for the CLI, diff and exporter tests."""
import os
import subprocess
import sys

from instrument import histogram as _hist
from instrument.snapshot import Snapshot, StageStats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def st(path, calls, per_call_ns, self_ns=None, cpu_ns=None, errors=0, counters=None, ops=None, values=None):
    """A stage whose `calls` calls each took `per_call_ns` (or took `values`)."""
    values = list(values) if values is not None else [per_call_ns] * calls
    hist = {}
    for v in values:
        hist[_hist.index(v)] = hist.get(_hist.index(v), 0) + 1
    total = sum(values)
    return StageStats(tuple(path.split("/")) if isinstance(path, str) else tuple(path), len(values), errors, total,
                      total if self_ns is None else self_ns, min(values) if values else None,
                      max(values) if values else None, cpu_ns, cpu_ns, len(values) if cpu_ns is not None else 0,
                      hist, counters or {}, ops=ops)


def snap(*stages, pid=1000, start=1_700_000_000.0, events=None):
    return Snapshot(stages, {"pid": pid, "host": "testhost", "argv": ["serve.py"], "start_time": start,
                             "end_time": start + 60, "duration_ns": 60_000_000_000}, events)


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([ROOT] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    return e


def cli(*args, timeout=120, **kw):
    """`python -m instrument ARGS` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "instrument", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env(), **kw)
