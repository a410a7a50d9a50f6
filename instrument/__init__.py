"""instrument: where the time of an inference service goes, per stage.

    import instrument

    TOKENIZE = instrument.stage("tokenize")

    @instrument.region
    def preprocess(texts): ...

    with instrument.stage("request"):
        with TOKENIZE:
            instrument.add("tokens", 512)       # items of the innermost open stage
            ...
    instrument.report()

This module is the public face: it wires the live side (instrument.live) to the
model (instrument.snapshot) and the analysis (instrument.analysis); nothing else
but the command line reaches into the live side.
"""
from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Optional

from . import config as _config
from ._version import __version__
from .analysis.diff import Diff
from .analysis.diff import diff as _diff
from .analysis.verdict import with_verdicts
from .live import backend as _live_backend
from .live import collector as _collector
from .live.capture import capture, capture_every
from .live.collector import configure, current_config, region, reset, stage
from .snapshot import Snapshot, SnapshotError, StageStats

_collector.judge = with_verdicts   # live snapshots carry verdicts, judged by the thresholds in force
Snapshot.judge = with_verdicts     # and loaded ones, by the thresholds they were recorded with

add = _live_backend.current.add   # add(name, value=1): items of the innermost open stage; the hot path's own function


def _on_backend_switch(module) -> None:
    global add
    add = module.add


_live_backend.on_switch(_on_backend_switch)


def snapshot() -> Snapshot:
    """An immutable Snapshot of everything recorded so far, with verdicts; callable any time."""
    return _collector.snapshot()


def report(snap: Optional[Snapshot] = None, file=None, format: str = "table", **options: Any) -> str:
    """Print the per-stage breakdown of `snap` (default: a snapshot now) to stdout
    or `file` in `format` (one of instrument.exporters.formats()), and return it.
    Options: those of that format's render (the table's: sort, depth, fold, width,
    columns, title)."""
    from .exporters import formats
    if format not in formats():
        raise ValueError(f"format must be one of {', '.join(formats())}, got {format!r}")
    text = formats()[format].render([snap if snap is not None else snapshot()], **options)
    print(text, file=file or sys.stdout)
    return text


def diff(before: Snapshot, after: Snapshot, alpha: Optional[float] = None,
         min_change: Optional[float] = None, basis: Optional[str] = None, reference=None) -> Diff:
    """Stage-by-stage comparison of two snapshots, each change tested against noise
    (instrument.analysis.diff) on `basis` ("turns", "windows", "runs"; None: the strongest
    the snapshots allow), time judged relative to the `reference` stage where one is named;
    alpha and min_change default to the diff_alpha and diff_min_change options in force."""
    cfg = current_config()
    return _diff(before, after, alpha=cfg.diff_alpha if alpha is None else alpha,
                 min_change=cfg.diff_min_change if min_change is None else min_change, basis=basis,
                 reference=reference)


def profile(schedule=None, record_shapes=False, activities=None, **kwargs):
    """torch.profiler.profile(...) whose events are also attributed to stages (instrument.live.torch_profiler)."""
    from .live import torch_profiler, torchwatch
    torchwatch.ensure()
    return torch_profiler.profile(schedule=schedule, record_shapes=record_shapes, activities=activities, **kwargs)


def serve_metrics(port: int, addr: str = "127.0.0.1"):
    """Serve this process's stages on addr:port (127.0.0.1 unless told) from a daemon
    thread: Prometheus metrics at /metrics and the snapshot as JSON at /snapshot
    (read by `instrument top`); with PROMETHEUS_MULTIPROC_DIR set, the merge of every
    worker's snapshot there (start_snapshot_writer).  Returns the server
    (`.server_port`, `.shutdown()`).  Needs prometheus_client."""
    from . import config
    from .serve import metrics, multiproc
    source = snapshot
    if config.shared_folder():
        folder = multiproc.folder()
        source = lambda: multiproc.merged_snapshot(folder)   # noqa: E731
    return metrics.serve_metrics(port, addr, source=source)


_served = None            # (address, server) started by the `serve` option
_serve_lock = threading.Lock()


def _serve_configured(address: Optional[str]) -> None:
    """Start, move or stop the server the `serve` option asks for; a failure is a warning, never an exception."""
    global _served
    from . import config
    with _serve_lock:
        if _served is not None and _served[0] == address:
            return
        if _served is not None:
            _served[1].shutdown()
            _served[1].server_close()
            _served = None
        if not address:
            return
        host, port = config.serve_address(address)
        try:
            _served = (address, serve_metrics(port, host))
        except Exception as e:   # stacklevel: the caller of configure()
            warnings.warn(f"instrument: cannot serve /metrics and /snapshot on {address}: "
                          f"{getattr(e, 'strerror', None) or e}", RuntimeWarning, stacklevel=4)


def _on_configure(cfg, options) -> None:
    """configure(serve=...) starts, moves or (None) stops the server of /metrics and /snapshot."""
    if "serve" in options or "serve_any_host" in options:
        _serve_configured(cfg.serve)


_collector.on_configure(_on_configure)


def start_snapshot_writer(directory: Optional[str] = None, interval: float = 5.0, every_call: bool = True):
    """Share this process's snapshot with the other workers of the service: kept in
    `<directory>/instrument-<pid>-<token>.snap` (default $PROMETHEUS_MULTIPROC_DIR),
    rewritten after every outermost stage exit (every_call: a worker killed with
    SIGKILL loses no completed call), every `interval` seconds and at exit.  Processes
    forked afterwards keep their own file.  `serve_metrics` and `instrument top` then
    serve and read the merge.  Returns the writer (`.path`, `.writes`, `.failures`)."""
    from .serve import multiproc
    w = multiproc.start_snapshot_writer(directory, interval, source=lambda: _collector.snapshot(judged=False))
    _collector.on_root_exit(w.root_exit if every_call else None)
    return w


def stop_snapshot_writer() -> None:
    """Write a last time and stop sharing (see start_snapshot_writer)."""
    _collector.on_root_exit(None)
    from .serve import multiproc
    multiproc.stop_snapshot_writer()


def _snapshot_html(snap: Snapshot) -> str:
    from . import notebook
    return notebook.snapshot_html(snap)


Snapshot.html_view = _snapshot_html   # notebooks show a Snapshot as the HTML report (instrument.notebook)


def load_ipython_extension(ipython) -> None:
    """`%load_ext instrument`: the %%instrument, %instrument_report and %instrument_diff magics
    (instrument.notebook)."""
    from . import notebook
    notebook.load(ipython, snapshot, stage)


# Instrumentation without code edits, imported on first use: those modules build on this facade, and torch,
# transformers or a web framework are imported only by what is used.  asgi, wsgi and transformers are
# submodules, so `from instrument.asgi import Middleware` works too; `modules` is a function of auto/.
_AUTO = {"modules": ("instrument.auto.modules", "modules"), "asgi": ("instrument.asgi", None),
         "wsgi": ("instrument.wsgi", None), "transformers": ("instrument.transformers", None)}


def __getattr__(name: str):
    """instrument.modules(model), instrument.asgi.Middleware, instrument.wsgi.Middleware, instrument.transformers."""
    if name not in _AUTO:
        raise AttributeError(f"module 'instrument' has no attribute {name!r}")
    import importlib
    module_name, attr = _AUTO[name]
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_AUTO))


if current_config().serve and not _config.command_line():   # the command reads services, it does not serve
    _serve_configured(current_config().serve)


__all__ = ["stage", "region", "add", "capture", "capture_every", "profile", "snapshot", "report", "diff", "configure",
           "current_config", "reset", "serve_metrics", "start_snapshot_writer", "stop_snapshot_writer", "Snapshot",
           "StageStats", "SnapshotError", "Diff", "modules",
           "__version__"]
