import pytest

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

import instrument  # noqa: E402
from instrument.serve import otel  # noqa: E402
from snapfactory import snap, st  # noqa: E402


def points(reader):
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[(m.name, m.unit, p.attributes["path"])] = p
    return out


def meter():
    reader = InMemoryMetricReader()
    return reader, MeterProvider(metric_readers=[reader]).get_meter("test")


def test_counts_equal_snapshot_calls():
    reader, m = meter()
    values = [900, 50_000, 50_100, 2_000_000, 2_000_000, 3_500_000_000]
    s = snap(st("request", 0, 0, values=values, errors=1), st("request/tokenize", 4, 250_000))
    bridge = otel.OTelBridge(m)
    assert bridge.record(s) == len(values) + 4
    p = points(reader)
    req = p[("instrument.stage.duration", "s", "request")]
    assert req.count == len(values) and req.attributes["stage"] == "request"
    assert req.sum == pytest.approx(sum(values) / 1e9, rel=0.008)
    assert p[("instrument.stage.duration", "s", "request/tokenize")].count == 4
    assert p[("instrument.stage.errors", "{call}", "request")].value == 1
    assert bridge.record(s) == 0                 # nothing new: nothing recorded twice
    more = snap(st("request", 0, 0, values=values + [1_000], errors=1), st("request/tokenize", 9, 250_000))
    assert bridge.record(more) == 6
    p = points(reader)
    assert p[("instrument.stage.duration", "s", "request")].count == len(values) + 1
    assert p[("instrument.stage.duration", "s", "request/tokenize")].count == 9


def test_module_record_of_the_live_snapshot(backend):
    reader, m = meter()
    for _ in range(12):
        with instrument.stage("live"):
            pass
    assert otel.record(instrument.snapshot(), meter=m) == 12
    with instrument.stage("live"):
        pass
    assert otel.record(instrument.snapshot(), meter=m) == 1
    assert points(reader)[("instrument.stage.duration", "s", "live")].count == 13
    bridge = otel.OTelBridge(m, source=instrument.snapshot)     # a bridge that takes its own snapshots
    with instrument.stage("live"):
        pass
    assert bridge.record() == 14
    with pytest.raises(ValueError, match="needs a Snapshot, or a bridge made with source="):
        otel.OTelBridge(m).record()
