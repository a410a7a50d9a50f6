"""Prometheus metrics from Snapshots, through a `prometheus_client` custom collector,
and the HTTP server that serves them with the snapshot as JSON.

    from prometheus_client import REGISTRY
    from instrument.exporters.prometheus import InstrumentCollector
    REGISTRY.register(InstrumentCollector(instrument.snapshot))   # a snapshot at each scrape
    instrument.serve_metrics(9464)          # or: /metrics and /snapshot on 127.0.0.1:9464

The live side is never imported here: whatever needs live snapshots is given a
snapshot function (`source`), as the facade's `serve_metrics` does.

Every metric family is in METRICS (docs/prometheus.md lists them with labels and
units): per stage, labels `stage` (its name) and `path` ("a/b"; a '/' or '\\'
inside a name escaped with '\\', so a stage named "a/b" has path "a\\/b"); names
and units follow the Prometheus conventions (seconds, `_total` on counters, no
type in the name), which `promtool check metrics` verifies in the tests.  Label
values are escaped by prometheus_client; their number is bounded by the stage cap
(`max_stages`: calls beyond it are folded into "(other)").

Items added with `instrument.add` are `instrument_stage_items_total{item=...}`.
A rank of a torch.distributed job (and a merge of ranks) also has its figures per rank,
`instrument_stage_rank_*{rank=...}`.
Exemplars: in the OpenMetrics exposition (`render(snap, openmetrics=True)`, or a
scrape that asks for it, as Prometheus does with `--enable-feature=exemplar-storage`),
the duration buckets of a top-level stage carry its slowest calls, one per bucket:
labels `call` ("pid:seq") and `stage` (the stage that took most of that call),
value its wall time, timestamp its start.

Several processes (gunicorn workers): each keeps its snapshot in a shared folder
(instrument.exporters.multiproc) and, with PROMETHEUS_MULTIPROC_DIR set,
`serve_metrics` and `multiprocess_collector` serve the exact merge of the folder.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable, Iterator, List, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from .. import histogram as _hist
from ..snapshot import Snapshot, StageStats, path_text, rank_figures, rank_of
from . import multiproc

POWERS = range(10, 37)
BOUNDS_NS = [(1 << k) - 1 for k in POWERS]   # le is inclusive and times are integer ns: 2**k - 1 == "below 2**k"
LABELS = ["stage", "path"]
CLOCK_EVENTS = ("task-clock", "cpu-clock")      # perf software clocks count nanoseconds: exported in seconds

#: every metric family: name -> (type, extra labels, unit, help); docs/prometheus.md lists the same
METRICS = {
    "instrument_stage_duration_seconds": ("histogram", [], "seconds", "Wall time of completed calls of a stage"),
    "instrument_stage_self_seconds": ("counter", [], "seconds", "Wall time of a stage outside its child stages"),
    "instrument_stage_errors": ("counter", [], "calls", "Calls of a stage that exited by an exception"),
    "instrument_stage_cpu_seconds": ("counter", [], "seconds", "Thread CPU time spent in a stage"),
    "instrument_stage_cpu_mode_seconds": ("counter", ["mode"], "seconds",
                                          "Thread CPU time of a stage in user space and in the kernel (mode "
                                          "user or system, from the thread's rusage)"),
    "instrument_stage_gpu_seconds": ("counter", [], "seconds", "GPU time of a stage, from CUDA events"),
    "instrument_stage_gpu_samples": ("counter", [], "calls", "Calls of a stage whose GPU time was measured"),
    "instrument_stage_perf_events": ("counter", ["event"], "events",
                                     "perf_event counts of a stage (cycles, instructions, page-faults, ...)"),
    "instrument_stage_perf_clock_seconds": ("counter", ["event"], "seconds",
                                            "perf_event software clocks of a stage (task-clock, cpu-clock)"),
    "instrument_stage_items": ("counter", ["item"], "items",
                               "Items added to a stage with instrument.add (tokens, samples, bytes, ...)"),
    "instrument_stage_rank_seconds": ("counter", ["rank"], "seconds",
                                      "Wall time of a stage on each rank of a torch.distributed job"),
    "instrument_stage_rank_self_seconds": ("counter", ["rank"], "seconds",
                                           "Wall time of a stage outside its child stages on each rank"),
    "instrument_stage_rank_calls": ("counter", ["rank"], "calls", "Completed calls of a stage on each rank"),
    "instrument_processes": ("gauge", None, "processes", "Processes whose snapshots are merged into these metrics"),
}


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


def with_exemplars(s: StageStats, snap: Snapshot, cumulative: List[tuple]) -> List[tuple]:
    """The buckets of a top-level stage with its slowest calls as exemplars, the slowest one per bucket
    (OpenMetrics allows one exemplar per bucket; the text format 0.0.4 leaves them out)."""
    slow = sorted((e for e in snap.exemplars if e["slow"] and tuple(e["path"]) == s.path), key=lambda e: -e["wall_ns"])
    if not slow:
        return cumulative
    t0 = snap.meta.get("start_time")
    out = [list(b) for b in cumulative]
    for e in slow:
        le = next(i for i, b in enumerate(out) if b[0] == "+Inf" or e["wall_ns"] <= float(b[0]) * 1e9 + 0.5)
        if len(out[le]) > 2:
            continue
        top = max(e["breakdown"], key=lambda b: b["wall_ns"], default=None)
        labels = {"call": f"{e.get('pid')}:{e.get('seq')}"}
        if top is not None:
            labels["stage"] = path_text(top["path"])[:100]   # an exemplar's labels hold at most 128 characters
        ts = t0 + e["start_ns"] / 1e9 if isinstance(t0, (int, float)) else None
        out[le].append(Exemplar(labels, e["wall_ns"] / 1e9, ts))
    return [tuple(b) for b in out]


def _family(name: str) -> Metric:
    kind, extra, _unit, doc = METRICS[name]
    labels = [] if extra is None else LABELS + extra
    cls = {"histogram": HistogramMetricFamily, "counter": CounterMetricFamily, "gauge": GaugeMetricFamily}[kind]
    return cls(name, doc, labels=labels)


def families(snap: Snapshot) -> List[Metric]:
    fam = {name: _family(name) for name in METRICS}
    rank = rank_of(snap.meta)   # a rank's own process: its figures under its rank
    for s in snap:
        lab = [s.name, path_text(s.path)]
        for r, f in sorted((s.ranks or ({rank: rank_figures(s)} if rank is not None and s.calls else {})).items()):
            fam["instrument_stage_rank_seconds"].add_metric(lab + [str(r)], f["wall_ns"] / 1e9)
            fam["instrument_stage_rank_self_seconds"].add_metric(lab + [str(r)], f["self_ns"] / 1e9)
            fam["instrument_stage_rank_calls"].add_metric(lab + [str(r)], f["calls"])
        fam["instrument_stage_duration_seconds"].add_metric(lab, with_exemplars(s, snap, buckets(s)), s.wall_total / 1e9)
        for item, it in s.items.items():
            fam["instrument_stage_items"].add_metric(lab + [item], it["total"])
        fam["instrument_stage_self_seconds"].add_metric(lab, s.wall_self / 1e9)
        fam["instrument_stage_errors"].add_metric(lab, s.errors)
        if s.cpu_total is not None:
            fam["instrument_stage_cpu_seconds"].add_metric(lab, s.cpu_total / 1e9)
        if s.cpu_sys_total is not None and s.cpu_user_total is not None:
            fam["instrument_stage_cpu_mode_seconds"].add_metric(lab + ["user"], s.cpu_user_total / 1e9)
            fam["instrument_stage_cpu_mode_seconds"].add_metric(lab + ["system"], s.cpu_sys_total / 1e9)
        if s.gpu and s.gpu.get("total_ns") is not None:
            fam["instrument_stage_gpu_seconds"].add_metric(lab, s.gpu["total_ns"] / 1e9)
            fam["instrument_stage_gpu_samples"].add_metric(lab, int(s.gpu.get("samples") or 0))
        for ev, c in s.counters.items():
            total = c.get("total")
            if total is None:
                continue   # a counter that never counted is absent, not 0
            if ev in CLOCK_EVENTS:
                fam["instrument_stage_perf_clock_seconds"].add_metric(lab + [ev], total / 1e9)
            else:
                fam["instrument_stage_perf_events"].add_metric(lab + [ev], total)
    fam["instrument_processes"].add_metric([], len(snap.meta.get("merged_from") or [None]))
    return list(fam.values())


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


def render(snap: Snapshot, openmetrics: bool = False) -> str:
    """The Prometheus text exposition format of `snap` (OpenMetrics, with exemplars, when asked)."""
    reg = CollectorRegistry()
    reg.register(InstrumentCollector(lambda: snap))
    return (generate_openmetrics if openmetrics else generate_latest)(reg).decode()


text = render


def write_textfile(path: str, snap: Snapshot) -> None:
    """Atomically, for node_exporter's textfile collector."""
    reg = CollectorRegistry()
    reg.register(InstrumentCollector(lambda: snap))
    write_to_textfile(path, reg)


# ------------------------------------------------------------ multiprocess
# The shared folder's files are instrument.exporters.multiproc's; these names stay here for existing callers.
merged_snapshot = multiproc.merged_snapshot
save_snapshot = multiproc.save_snapshot
start_snapshot_writer = multiproc.start_snapshot_writer
stop_snapshot_writer = multiproc.stop_snapshot_writer


def multiprocess_collector(directory: Optional[str] = None) -> InstrumentCollector:
    """A collector serving the exact merge of the folder's snapshots (default $PROMETHEUS_MULTIPROC_DIR)."""
    d = multiproc.folder(directory)
    return InstrumentCollector(lambda: multiproc.merged_snapshot(d))


# ------------------------------------------------------------------- serving
MAX_SNAPSHOT_BYTES = 64 << 20      # /snapshot refuses (503) to send more; /metrics is what scales
SNAPSHOT_PATH = "/snapshot"


def snapshot_body(snap: Snapshot, limit: Optional[int] = None) -> bytes:
    """The JSON /snapshot sends: the snapshot without its timeline events (the Chrome
    trace's ring, which can be large).  ValueError when it is over `limit` bytes
    (default MAX_SNAPSHOT_BYTES)."""
    limit = MAX_SNAPSHOT_BYTES if limit is None else limit
    body = Snapshot(snap.stages, snap.meta).to_json().encode("utf-8")
    if len(body) > limit:
        raise ValueError(f"the snapshot is {len(body)} bytes, over the {limit} bytes /snapshot sends; lower "
                         "max_stages or read /metrics")
    return body


def make_app(source: Callable[[], Snapshot], registry: CollectorRegistry) -> Callable:
    """The WSGI application: GET /snapshot is `source()` as JSON, any other GET path the
    Prometheus exposition of `registry`.  Read-only: every method but GET and HEAD is
    answered 405 and nothing in a request reaches the process's state."""
    metrics_app = make_wsgi_app(registry)

    def app(environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"read-only: GET /metrics or /snapshot\n"]
        if environ.get("PATH_INFO", "/").rstrip("/") == SNAPSHOT_PATH:
            try:
                body, status = snapshot_body(source()), "200 OK"
            except ValueError as e:
                body, status = json.dumps({"error": str(e)}).encode(), "503 Service Unavailable"
            except Exception as e:   # a snapshot that cannot be taken is an answer, never a dead server
                body, status = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode(), "500 Internal Server Error"
            start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                    ("Cache-Control", "no-store")])
            return [b"" if method == "HEAD" else body]
        return metrics_app(environ, start_response)
    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True     # a slow client never holds the process at exit
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):   # a scraped endpoint logs nothing to the service's stderr
        pass


def serve_metrics(port: int, addr: str = "127.0.0.1", source: Optional[Callable[[], Snapshot]] = None,
                  registry: Optional[CollectorRegistry] = None):
    """Serve /metrics (Prometheus) and /snapshot (JSON) on addr:port (127.0.0.1 unless
    told) from a daemon thread and return the HTTP server (`.server_port`,
    `.shutdown()`, `.server_close()`).  With PROMETHEUS_MULTIPROC_DIR set, both serve
    the merge of the workers' snapshot files; otherwise `source()`
    (instrument.serve_metrics passes instrument.snapshot)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 to 65535, got {port!r}")
    if registry is None:
        registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        d = multiproc.folder()
        source = lambda: multiproc.merged_snapshot(d)   # noqa: E731
    elif source is None:
        raise TypeError("serve_metrics needs source=, a function returning a Snapshot (or use "
                        "instrument.serve_metrics, which serves this process's)")
    elif not callable(source):
        raise TypeError(f"source must be a function returning a Snapshot, got {type(source).__name__}")
    registry.register(InstrumentCollector(source))
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    server_class = type("InstrumentServer", (_Server,), {"address_family": family})
    server = make_server(addr, port, make_app(source, registry), server_class, handler_class=_QuietHandler)
    server.thread = threading.Thread(target=server.serve_forever, name="instrument-metrics-server", daemon=True)
    server.thread.start()
    return server
