"""The HTTP server of a running process: `/metrics` (the Prometheus exposition of
instrument.exporters.prometheus) and `/snapshot` (the snapshot as JSON, what
`instrument top` reads), from a daemon thread.

    server = serve_metrics(9464, source=instrument.snapshot)   # instrument.serve_metrics(9464) does this

Read-only: GET and HEAD of those two paths are answered, other methods 405,
other paths 404; nothing in a request reaches the process's state.  `source` is
called at each request; the live side is never imported here.
"""
from __future__ import annotations

import json
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..exporters.prometheus import InstrumentCollector, client
from ..snapshot import Snapshot
from . import multiproc

MAX_SNAPSHOT_BYTES = 64 << 20      # /snapshot refuses (503) to send more; /metrics is what scales
SNAPSHOT_PATH = "/snapshot"
METRICS_PATH = "/metrics"


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


def _answer(start_response, status: str, ctype: str, body: bytes, head: bool, *extra) -> list:
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))), *extra])
    return [b"" if head else body]


def make_app(source: Callable[[], Snapshot], registry) -> Callable:
    """The WSGI application: GET /snapshot is `source()` as JSON, GET /metrics the Prometheus
    exposition of `registry`; any other path 404, any other method 405."""
    from prometheus_client import make_wsgi_app
    metrics_app = make_wsgi_app(registry)

    def app(environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/").rstrip("/")
        if method not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", "text/plain",
                           b"read-only: GET /metrics or /snapshot\n", False, ("Allow", "GET, HEAD"))
        if path == METRICS_PATH:
            return metrics_app(environ, start_response)
        if path != SNAPSHOT_PATH:
            return _answer(start_response, "404 Not Found", "text/plain",
                           b"not found: instrument serves /metrics and /snapshot\n", method == "HEAD")
        try:
            body, status = snapshot_body(source()), "200 OK"
        except ValueError as e:
            body, status = json.dumps({"error": str(e)}).encode(), "503 Service Unavailable"
        except Exception as e:   # a snapshot that cannot be taken is an answer, never a dead server
            body, status = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode(), "500 Internal Server Error"
        return _answer(start_response, status, "application/json", body, method == "HEAD",
                       ("Cache-Control", "no-store"))
    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True     # a slow client never holds the process at exit
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):   # a scraped endpoint logs nothing to the service's stderr
        pass


def serve_metrics(port: int, addr: str = "127.0.0.1", source: Optional[Callable[[], Snapshot]] = None,
                  registry=None):
    """Serve /metrics (Prometheus) and /snapshot (JSON) of `source()` on addr:port (127.0.0.1
    unless told) from a daemon thread and return the HTTP server (`.server_port`, `.shutdown()`,
    `.server_close()`).  registry: a prometheus_client CollectorRegistry to add the metrics to."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 to 65535, got {port!r}")
    if not callable(source):
        raise TypeError(f"source must be a function returning a Snapshot (such as instrument.snapshot), "
                        f"got {type(source).__name__}")
    client()
    from prometheus_client import CollectorRegistry
    if registry is None:
        registry = CollectorRegistry()
    registry.register(InstrumentCollector(source))
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    server_class = type("InstrumentServer", (_Server,), {"address_family": family})
    server = make_server(addr, port, make_app(source, registry), server_class, handler_class=_QuietHandler)
    server.thread = threading.Thread(target=server.serve_forever, name="instrument-metrics-server", daemon=True)
    server.thread.start()
    return server


def multiprocess_collector(directory: Optional[str] = None) -> InstrumentCollector:
    """A collector serving the exact merge of the workers' snapshots in a folder (default
    $PROMETHEUS_MULTIPROC_DIR), for the registry of an existing /metrics route."""
    d = multiproc.folder(directory)
    return InstrumentCollector(lambda: multiproc.merged_snapshot(d))
