"""Prometheus metrics from Snapshots, through a `prometheus_client` custom collector.

    from prometheus_client import REGISTRY
    from instrument.exporters.prometheus import InstrumentCollector
    REGISTRY.register(InstrumentCollector(instrument.snapshot))   # a snapshot at each scrape
    instrument.serve_metrics(9464)          # or: its own HTTP server on 127.0.0.1:9464

The live side is never imported here: whatever needs live snapshots is given a
snapshot function (`source`), as the facade's `serve_metrics` does.

Per stage, labels `stage` (its name) and `path` ("a/b"; a '/' or '\\' inside a name escaped
with '\\', so a stage named "a/b" has path "a\\/b"):

- `instrument_stage_duration_seconds` histogram; bucket bounds are 2**k - 1 ns
  (k = 10..36, about 1 µs to 69 s), which fall on the snapshot histogram's bucket
  edges, so every cumulative count is exact
- `instrument_stage_self_seconds_total`, `instrument_stage_errors_total`,
  `instrument_stage_cpu_seconds_total`, `instrument_stage_gpu_seconds_total`
- `instrument_stage_counter_total{event=...}`: each perf counter's total
- `instrument_stage_ipc`, `..._cache_miss_ratio`, ... derived ratios where the counters allow

Several processes (gunicorn workers, multiprocessing): each worker saves its
snapshot into a shared folder (`start_snapshot_writer(source=instrument.snapshot)`, every few seconds and
at exit) and `multiprocess_collector(dir)` serves their exact merge.  With
`PROMETHEUS_MULTIPROC_DIR` set, both default to that folder and `serve_metrics`
uses the merging collector.  Clear the folder when the service starts, as for
prometheus_client's own multiprocess mode; files of workers that exited stay
counted, so totals keep growing like counters should.
"""
from __future__ import annotations

import atexit
import glob
import os
import threading
from typing import Callable, Iterator, List, Optional

from prometheus_client import CollectorRegistry, generate_latest, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from .. import counters
from .. import histogram as _hist
from ..snapshot import Snapshot, SnapshotError, StageStats, path_text

POWERS = range(10, 37)
BOUNDS_NS = [(1 << k) - 1 for k in POWERS]   # le is inclusive and times are integer ns: 2**k - 1 == "below 2**k"
LABELS = ["stage", "path"]
DERIVED = ("ipc", "cache_miss_ratio", "mpki", "branch_miss_ratio", "cpu_utilisation")


def buckets(s: StageStats) -> List[tuple]:
    """Cumulative (le, count) pairs, +Inf last with the call count."""
    ends = sorted((_hist.bounds(i)[1], c) for i, c in s.hist.items() if c)
    out, acc, j = [], 0, 0
    for b in BOUNDS_NS:
        while j < len(ends) and ends[j][0] <= b + 1:
            acc += ends[j][1]
            j += 1
        out.append((floatToGoString(b / 1e9), min(acc, s.calls)))
    out.append(("+Inf", s.calls))
    return out


def _derived(s: StageStats) -> dict:
    totals = {k: v.get("total") for k, v in s.counters.items()}
    try:
        return counters.derived(totals, s.wall_total, s.cpu_total)
    except Exception:
        return {}


def families(snap: Snapshot) -> List[Metric]:
    hist = HistogramMetricFamily("instrument_stage_duration_seconds", "Wall time of completed calls of a stage",
                                 labels=LABELS)
    self_ = CounterMetricFamily("instrument_stage_self_seconds", "Wall time of a stage outside its child stages",
                                labels=LABELS)
    errors = CounterMetricFamily("instrument_stage_errors", "Calls of a stage that exited by an exception",
                                 labels=LABELS)
    cpu = CounterMetricFamily("instrument_stage_cpu_seconds", "Thread CPU time spent in a stage", labels=LABELS)
    gpu = CounterMetricFamily("instrument_stage_gpu_seconds", "GPU time of a stage (CUDA events)", labels=LABELS)
    ctr = CounterMetricFamily("instrument_stage_counter", "perf_event counter totals of a stage",
                              labels=LABELS + ["event"])
    derived = {k: GaugeMetricFamily(f"instrument_stage_{k}", f"{k.replace('_', ' ')} of a stage from its counters",
                                    labels=LABELS) for k in DERIVED}
    for s in snap:
        lab = [s.name, path_text(s.path)]
        hist.add_metric(lab, buckets(s), s.wall_total / 1e9)
        self_.add_metric(lab, s.wall_self / 1e9)
        errors.add_metric(lab, s.errors)
        if s.cpu_total is not None:
            cpu.add_metric(lab, s.cpu_total / 1e9)
        if s.gpu and s.gpu.get("total_ns") is not None:
            gpu.add_metric(lab, s.gpu["total_ns"] / 1e9)
        for ev, c in s.counters.items():
            if c.get("total") is not None:
                ctr.add_metric(lab + [ev], c["total"])
        for k, v in _derived(s).items():
            if k in derived and v is not None:
                derived[k].add_metric(lab, v)
    procs = GaugeMetricFamily("instrument_processes", "Processes whose snapshots are merged into these metrics")
    procs.add_metric([], len(snap.meta.get("merged_from") or [None]))
    return [hist, self_, errors, cpu, gpu, ctr, *derived.values(), procs]


class InstrumentCollector:
    """A prometheus_client collector: `source()` gives the Snapshot to expose at each scrape."""

    def __init__(self, source: Callable[[], Snapshot]) -> None:
        if not callable(source):
            raise TypeError(f"source must be a function returning a Snapshot (such as instrument.snapshot), "
                            f"got {type(source).__name__}")
        self.source = source

    def describe(self) -> List[Metric]:
        return []   # no samples taken at registration time

    def collect(self) -> Iterator[Metric]:
        yield from families(self.source())


def render(snap: Snapshot) -> str:
    """The Prometheus text exposition format of `snap`."""
    reg = CollectorRegistry()
    reg.register(InstrumentCollector(lambda: snap))
    return generate_latest(reg).decode()


text = render


def write_textfile(path: str, snap: Snapshot) -> None:
    """Atomically, for node_exporter's textfile collector."""
    reg = CollectorRegistry()
    reg.register(InstrumentCollector(lambda: snap))
    write_to_textfile(path, reg)


# ------------------------------------------------------------ multiprocess
def _dir(directory: Optional[str]) -> str:
    d = directory or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not d:
        raise ValueError("no folder given and PROMETHEUS_MULTIPROC_DIR is not set")
    return d


def merged_snapshot(directory: Optional[str] = None) -> Snapshot:
    """The exact merge of every snapshot file (*.json) in the folder; unreadable files are skipped."""
    out = None
    for p in sorted(glob.glob(os.path.join(_dir(directory), "*.json"))):
        try:
            s = Snapshot.load(p)
        except SnapshotError:
            continue   # not ours, or a worker's file being replaced: saves are atomic, so it is whole next time
        out = s if out is None else out.merge(s)
    return out if out is not None else Snapshot([], {"merged_from": []})


def multiprocess_collector(directory: Optional[str] = None) -> InstrumentCollector:
    d = _dir(directory)
    return InstrumentCollector(lambda: merged_snapshot(d))


def save_snapshot(source: Callable[[], Snapshot], directory: Optional[str] = None) -> str:
    """Save this process's snapshot (`source()`) as <folder>/instrument.<pid>.json (atomic)."""
    return source().save(os.path.join(_dir(directory), f"instrument.{os.getpid()}.json"))


class _Writer:
    def __init__(self, source: Callable[[], Snapshot], directory: str, interval: float) -> None:
        self.source, self.directory, self.interval = source, directory, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="instrument-snapshot-writer", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            _save_quietly(self.source, self.directory)

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(30)   # let a save in progress finish: a daemon killed mid-save leaves its temp file


_writer: Optional[_Writer] = None
_hooks_installed = False


def _save_quietly(source: Callable[[], Snapshot], directory: str) -> None:
    try:
        save_snapshot(source, directory)
    except Exception:
        pass   # a full disk must not take the worker down; the next save tries again


def start_snapshot_writer(directory: Optional[str] = None, interval: float = 5.0,
                          source: Optional[Callable[[], Snapshot]] = None) -> None:
    """Save this process's snapshot (`source()`, e.g. instrument.snapshot) into the
    folder every `interval` seconds and at exit; processes forked afterwards
    (gunicorn workers) start their own writer."""
    global _writer, _hooks_installed
    d = _dir(directory)
    if not callable(source):
        raise TypeError("start_snapshot_writer needs source=, a function returning the process's Snapshot "
                        "(instrument.snapshot)")
    if interval <= 0:
        raise ValueError(f"interval must be positive, got {interval!r}")
    stop_snapshot_writer()
    _writer = _Writer(source, d, interval)
    if not _hooks_installed:
        _hooks_installed = True
        atexit.register(_final_save)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_restart_in_child)


def _final_save() -> None:
    w = _writer
    if w is not None:
        w.close()
        _save_quietly(w.source, w.directory)


def _restart_in_child() -> None:
    global _writer
    if _writer is not None:
        _writer = _Writer(_writer.source, _writer.directory, _writer.interval)   # threads do not survive fork


def stop_snapshot_writer() -> None:
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None


def serve_metrics(port: int, addr: str = "127.0.0.1", source: Optional[Callable[[], Snapshot]] = None,
                  registry: Optional[CollectorRegistry] = None):
    """Serve /metrics on addr:port (127.0.0.1 unless told) in a daemon thread and
    return the HTTP server (`.server_port`, `.shutdown()`).  With
    PROMETHEUS_MULTIPROC_DIR set, serves the merge of the workers' snapshot files;
    otherwise `source()` (instrument.serve_metrics passes instrument.snapshot)."""
    if registry is None:
        registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry.register(multiprocess_collector())
    elif source is None:
        raise TypeError("serve_metrics needs source=, a function returning a Snapshot (or use "
                        "instrument.serve_metrics, which serves this process's)")
    else:
        registry.register(InstrumentCollector(source))
    r = start_http_server(port, addr=addr, registry=registry)
    return r[0] if isinstance(r, tuple) else r
