"""OpenTelemetry metrics from Snapshots, as OTLP/JSON: an ExportMetricsServiceRequest
that an OpenTelemetry Collector's OTLP/HTTP receiver takes as it is.

    instrument export --otel - run.json | curl -H 'Content-Type: application/json' \\
        --data-binary @- http://localhost:4318/v1/metrics

Instruments: `instrument.stage.duration` (histogram, unit "s", the Prometheus
format's bucket edges) and `instrument.stage.errors` (counter, stages with an
error only), attributes `stage` and `path` (names joined by '/', a '/' or '\\'
inside a name escaped with '\\'), cumulative from the recording's start.  The
histogram's count, bucket counts, min and max are the snapshot's, and its sum the
exact wall time.  The live bridge (instrument.serve.otel) records the same
instruments into an OpenTelemetry meter.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from .. import histogram as _hist
from .._version import __version__
from ..snapshot import Snapshot, StageStats, path_text
from . import snapshots
from .format import DURATION_BOUNDS_NS, duration_buckets

NAME = "otel"
EXTENSION = ".json"


@dataclass(frozen=True)
class Instrument:
    name: str
    unit: str
    description: str


DURATION = Instrument("instrument.stage.duration", "s", "Wall time of completed calls of a stage")
ERRORS = Instrument("instrument.stage.errors", "{call}", "Calls of a stage that exited by an exception")
BOUNDS_S = [b / 1e9 for b in DURATION_BOUNDS_NS]
SCOPE = "instrument"
CUMULATIVE = 2   # AggregationTemporality in OTLP


def attributes(s: StageStats) -> Dict[str, str]:
    return {"stage": s.name, "path": path_text(s.path)}


def value_s(s: StageStats, i: int) -> float:
    """A call of histogram bucket `i` in seconds: the bucket's midpoint (within 0.78 % of the call), held to the
    stage's exact min and max."""
    v = _hist.midpoint(i)
    v = min(max(v, s.wall_min if s.wall_min is not None else v), s.wall_max if s.wall_max is not None else v)
    return v / 1e9


def _attrs(d: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Attributes as OTLP/JSON's KeyValue list (64-bit integers as strings, as the protobuf JSON mapping says)."""
    return [{"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": str(v)}}
            for k, v in d.items()]


def _nanos(t: Optional[float]) -> str:
    return str(round((t or 0) * 1e9))


def _histogram_point(s: StageStats, times: Dict[str, str]) -> Dict[str, Any]:
    counts = duration_buckets(s)
    p: Dict[str, Any] = dict(attributes=_attrs(attributes(s)), **times, count=str(sum(counts)),
                             sum=s.wall_total / 1e9, bucketCounts=[str(c) for c in counts], explicitBounds=BOUNDS_S)
    if s.wall_min is not None and s.wall_max is not None:
        p.update(min=s.wall_min / 1e9, max=s.wall_max / 1e9)
    return p


def resource_metrics(snap: Snapshot) -> Dict[str, Any]:
    """One snapshot as OTLP's ResourceMetrics: its process (host.name, process.pid) and its stages."""
    m = snap.meta
    times = {"startTimeUnixNano": _nanos(m.get("start_time")), "timeUnixNano": _nanos(m.get("end_time"))}
    res = {k: m[f] for k, f in (("host.name", "host"), ("process.pid", "pid")) if m.get(f) is not None}
    timed = [s for s in snap if s.hist]
    metrics = [{"name": DURATION.name, "unit": DURATION.unit, "description": DURATION.description,
                "histogram": {"aggregationTemporality": CUMULATIVE,
                              "dataPoints": [_histogram_point(s, times) for s in timed]}}]
    failed = [s for s in snap if s.errors]
    if failed:
        metrics.append({"name": ERRORS.name, "unit": ERRORS.unit, "description": ERRORS.description,
                        "sum": {"aggregationTemporality": CUMULATIVE, "isMonotonic": True,
                                "dataPoints": [dict(attributes=_attrs(attributes(s)), **times, asInt=str(s.errors))
                                               for s in failed]}})
    return {"resource": {"attributes": _attrs(res)},
            "scopeMetrics": [{"scope": {"name": SCOPE, "version": __version__}, "metrics": metrics}]}


def render(snaps: Sequence[Snapshot]) -> str:
    """OTLP/JSON metrics (an ExportMetricsServiceRequest): each stage's duration histogram and error count.

    Each snapshot is one resource (its process), as a Collector keeps processes apart."""
    return json.dumps({"resourceMetrics": [resource_metrics(s) for s in snapshots(snaps)]}, allow_nan=False)
