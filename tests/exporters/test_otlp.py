"""The OTLP/JSON format, held to the OpenTelemetry SDK: the live bridge records the same
snapshot into the SDK's in-memory reader, and every data point the format writes has
the SDK's count, buckets, bounds, attributes, unit and temporality; its sum, min and
max are the snapshot's exact figures, where the SDK has the bucket midpoints."""
import json

import pytest

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader  # noqa: E402

from instrument.exporters import formats  # noqa: E402
from instrument.serve import otel as bridge  # noqa: E402
from instrument.snapshot import path_text  # noqa: E402
from snapfactory import snap, st  # noqa: E402

VALUES = [900, 50_000, 50_100, 2_000_000, 2_000_000, 3_500_000_000]


def sdk(s):
    """(metric, path) -> (metric, point) as the SDK holds them after the bridge recorded `s`."""
    reader = InMemoryMetricReader()
    bridge.OTelBridge(MeterProvider(metric_readers=[reader]).get_meter("t")).record(s)
    return {(m.name, p.attributes["path"]): (m, p) for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics for p in m.data.data_points}


def written(snaps):
    doc = json.loads(formats()["otel"].render(snaps))
    return doc["resourceMetrics"]


def attrs(kvs):
    return {kv["key"]: next(iter(kv["value"].values())) for kv in kvs}


def test_each_point_is_the_sdk_s_with_exact_sums():
    s = snap(st("request", 0, 0, values=VALUES, errors=2), st("request/tokenize", 4, 250_000),
             st(("request", "a/b"), 3, 7_000), pid=4242)
    by_path = {path_text(x.path): x for x in s}
    [rm] = written([s])
    assert attrs(rm["resource"]["attributes"]) == {"host.name": "testhost", "process.pid": "4242"}
    [sm] = rm["scopeMetrics"]
    assert sm["scope"]["name"] == "instrument"
    theirs = sdk(s)
    seen = set()
    for m in sm["metrics"]:
        kind = "histogram" if "histogram" in m else "sum"
        assert m[kind]["aggregationTemporality"] == AggregationTemporality.CUMULATIVE.value
        for p in m[kind]["dataPoints"]:
            a = attrs(p["attributes"])
            metric, q = theirs[(m["name"], a["path"])]
            seen.add((m["name"], a["path"]))
            assert (m["unit"], m["description"], a) == (metric.unit, metric.description, dict(q.attributes))
            assert metric.data.aggregation_temporality == AggregationTemporality.CUMULATIVE
            if kind == "sum":
                assert metric.data.is_monotonic and m["sum"]["isMonotonic"] and int(p["asInt"]) == q.value
                continue
            stage = by_path[a["path"]]
            assert int(p["count"]) == q.count == stage.calls
            assert [int(c) for c in p["bucketCounts"]] == list(q.bucket_counts)
            assert p["explicitBounds"] == list(q.explicit_bounds)
            assert p["sum"] == stage.wall_total / 1e9 == pytest.approx(q.sum, rel=1 / 128)   # exact; SDK midpoints
            assert (p["min"], p["max"]) == (stage.wall_min / 1e9, stage.wall_max / 1e9)
    assert seen == set(theirs) and ("instrument.stage.errors", "request") in seen and "request/a\\/b" in by_path
    req = theirs[("instrument.stage.duration", "request")][1]
    assert sum(req.bucket_counts) == len(VALUES) and req.sum == pytest.approx(sum(VALUES) / 1e9, rel=1 / 128)


def test_each_snapshot_is_a_resource_of_its_own():
    a, b = snap(st("req", 3, 1000), pid=1), snap(st("req", 4, 1000), pid=2)
    got = written([a, b])
    assert [attrs(r["resource"]["attributes"])["process.pid"] for r in got] == ["1", "2"]
    assert [r["scopeMetrics"][0]["metrics"][0]["histogram"]["dataPoints"][0]["count"] for r in got] == ["3", "4"]
    point = got[0]["scopeMetrics"][0]["metrics"][0]["histogram"]["dataPoints"][0]
    assert (int(point["startTimeUnixNano"]), int(point["timeUnixNano"])) == (1_700_000_000 * 10**9,
                                                                            1_700_000_060 * 10**9)
    assert len(got[0]["scopeMetrics"][0]["metrics"]) == 1      # no errors: no error counter, as the bridge


def test_export_otel_from_the_command_line(tmp_path, capsys):
    from instrument import cli
    snap(st("req", 3, 1000)).save(tmp_path / "a.json")
    assert cli.main(["export", "--otel", "-", str(tmp_path / "a.json")]) == 0
    [rm] = json.loads(capsys.readouterr().out)["resourceMetrics"]
    assert rm["scopeMetrics"][0]["metrics"][0]["name"] == "instrument.stage.duration"
