"""instrument: where the time of an inference service goes, per stage.

    import instrument

    TOKENIZE = instrument.stage("tokenize")

    @instrument.region
    def preprocess(texts): ...

    with instrument.stage("request"):
        with TOKENIZE:
            ...
    instrument.report()

This module is the public face: it wires the live side (instrument.live) to the
model (instrument.snapshot) and the analysis (instrument.analysis); nothing else
but the command line reaches into the live side.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

from ._version import __version__
from .analysis.diff import Diff
from .analysis.diff import diff as _diff
from .analysis.verdict import with_verdicts
from .live import collector as _collector
from .live.capture import capture, capture_every
from .live.collector import configure, current_config, region, reset, stage
from .snapshot import Snapshot, SnapshotError, StageStats

_collector._finish = with_verdicts   # live snapshots carry verdicts, judged by the thresholds in force


def snapshot() -> Snapshot:
    """An immutable Snapshot of everything recorded so far, with verdicts; callable any time."""
    return _collector.snapshot()


def report(snap: Optional[Snapshot] = None, file=None, **options: Any) -> str:
    """Print the per-stage breakdown of `snap` (default: a snapshot now) to stdout
    or `file`, and return it.  Options: those of instrument.exporters.table.render
    (sort, depth, fold, format, width, columns, title)."""
    from .exporters import table
    text = table.render(with_verdicts(snap) if snap is not None else snapshot(), **options)
    print(text, file=file or sys.stdout)
    return text


def diff(before: Snapshot, after: Snapshot, alpha: Optional[float] = None,
         min_change: Optional[float] = None) -> Diff:
    """Stage-by-stage comparison of two snapshots, each change tested against noise
    (instrument.analysis.diff); alpha and min_change default to the diff_alpha and
    diff_min_change options in force."""
    cfg = current_config()
    return _diff(before, after, alpha=cfg.diff_alpha if alpha is None else alpha,
                 min_change=cfg.diff_min_change if min_change is None else min_change)


def profile(schedule=None, record_shapes=False, activities=None, **kwargs):
    """torch.profiler.profile(...) whose events are also attributed to stages (instrument.live.torch_profiler)."""
    from .live import torch_profiler, torchwatch
    torchwatch.ensure()
    return torch_profiler.profile(schedule=schedule, record_shapes=record_shapes, activities=activities, **kwargs)


def serve_metrics(port: int, addr: str = "127.0.0.1"):
    """Serve this process's stages as Prometheus metrics on addr:port (127.0.0.1
    unless told) from a daemon thread; returns the server (`.server_port`,
    `.shutdown()`).  Needs prometheus_client."""
    from .exporters import prometheus
    return prometheus.serve_metrics(port, addr, source=snapshot)


__all__ = ["stage", "region", "capture", "capture_every", "profile", "snapshot", "report", "diff", "configure",
           "current_config", "reset", "serve_metrics", "Snapshot", "StageStats", "SnapshotError", "Diff",
           "__version__"]
