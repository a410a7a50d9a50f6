"""What serves a running process: the HTTP server of /metrics and /snapshot
(metrics.py), the snapshot files of a service's workers and their merge
(multiproc.py), and the OpenTelemetry bridge (otel.py).

Each is handed a snapshot function (`source=instrument.snapshot`, as the facade
does) and never imports the live side; the environment they follow
(PROMETHEUS_MULTIPROC_DIR) is read in instrument.config.
"""
