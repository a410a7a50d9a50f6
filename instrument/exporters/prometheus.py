"""Prometheus metrics from Snapshots, through a `prometheus_client` custom collector.

    instrument export --prometheus metrics.prom run.json      # a file (node_exporter's textfile collector)
    REGISTRY.register(InstrumentCollector(instrument.snapshot))   # a snapshot at each scrape of your registry
    instrument.serve_metrics(9464)      # /metrics and /snapshot on 127.0.0.1:9464 (instrument.serve.metrics)

Every metric family is in FAMILIES (docs/prometheus.md lists them with labels and
units): per stage, labels `stage` (its name as written) and `path`, its key ("a/b"; a '/' or '\\'
inside a name escaped with '\\', so a stage named "a/b" has path "a\\/b"); names
and units follow the Prometheus conventions (seconds, `_total` on counters, no
type in the name), which `promtool check metrics` verifies in the tests.  Label
values are escaped by prometheus_client; their number is bounded by the stage cap
(`max_stages`: calls beyond it are folded into "(other)").  Ratios (IPC, CPU/wall,
...) are left to PromQL, as rates of these sums: docs/prometheus.md gives each
metric of instrument.analysis.metrics in PromQL.

Items added with `instrument.add` are `instrument_stage_items_total{item=...}`.
A rank of a torch.distributed job (and a merge of ranks) also has its figures per rank,
`instrument_stage_rank_*{rank=...}`.
Exemplars: in the OpenMetrics exposition (`render(snaps, openmetrics=True)`, or a
scrape that asks for it, as Prometheus does with `--enable-feature=exemplar-storage`),
the duration buckets of a top-level stage carry its slowest calls, one per bucket:
labels `call` ("pid:seq") and `stage` (the path of the stage that took most of that call, names as written,
one holding a '/' quoted),
value its wall time, timestamp its start.

prometheus_client is an optional dependency (`pip install prometheus-client`),
imported when metrics are made, not with this module.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Iterator, List, Sequence

from ..snapshot import SPLIT, Z99, Snapshot, StageStats, path_text, rank_figures, rank_of
from . import Option, merged
from .format import DURATION_BOUNDS_NS, duration_buckets
from .format import path_text as shown_path

NAME = "prometheus"
EXTENSION = ".prom"
OPTIONS = (Option("openmetrics", "the OpenMetrics format, which carries the slowest calls as exemplars"),)

BOUNDS_NS = DURATION_BOUNDS_NS
LABELS = ["stage", "path"]
CLOCK_EVENTS = ("task-clock", "cpu-clock")      # perf software clocks count nanoseconds: exported in seconds

#: every metric family: name -> (type, extra labels, unit, help); docs/prometheus.md lists the same
FAMILIES = {
    "instrument_stage_duration_seconds": ("histogram", [], "seconds", "Wall time of completed calls of a stage"),
    "instrument_stage_self_seconds": ("counter", [], "seconds", "Wall time of a stage outside its child stages"),
    "instrument_stage_errors": ("counter", [], "calls", "Calls of a stage that exited by an exception"),
    "instrument_stage_cpu_seconds": ("counter", [], "seconds", "Thread CPU time spent in a stage"),
    "instrument_stage_cpu_mode_seconds": ("counter", ["mode"], "seconds",
                                          "Thread CPU time of a stage in user space and in the kernel (mode "
                                          "user or system, from the thread's rusage)"),
    "instrument_stage_cpu_error_seconds": ("gauge", [], "seconds",
                                           "Half-width of the 99 % interval of a stage's estimated CPU time (0: "
                                           "every call read)"),
    "instrument_stage_wall_split_seconds": ("counter", ["component"], "seconds",
                                            "A stage's own wall time in parts: component on_cpu, runqueue (ready, "
                                            "waiting for a CPU), blocked, gil (waiting to take the GIL), instrument "
                                            "(its own reads at the child "
                                            "stages' boundaries), awaiting, loop_ready, unknown"),
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
    "instrument_stage_memory_peak_bytes": ("gauge", ["source"], "bytes",
                                           "A memory source's peak above a call's start, mean per call of a stage "
                                           "(source host: resident set; python: traced heap; cuda:N allocated, "
                                           "cuda:N:reserved)"),
    "instrument_stage_memory_peak_max_bytes": ("gauge", ["source"], "bytes",
                                               "The largest peak above a call's start among a stage's calls measured"),
    "instrument_stage_memory_net_bytes": ("gauge", ["source"], "bytes",
                                          "A memory source at a call's exit less at its entry, mean per call of a "
                                          "stage (a gauge: it can be negative)"),
    "instrument_stage_memory_calls": ("counter", ["source"], "calls",
                                      "Calls of a stage whose memory was measured (not overlapped by another "
                                      "thread's or task's)"),
    "instrument_processes": ("gauge", None, "processes", "Processes whose snapshots are merged into these metrics"),
}


def client() -> None:
    """Import prometheus_client, or say in one line what to install."""
    try:
        importlib.import_module("prometheus_client")
    except ImportError as e:
        raise ImportError(f"the Prometheus format needs prometheus_client ({e}): pip install prometheus-client") \
            from None


def buckets(s: StageStats) -> List[tuple]:
    """Cumulative (le, count) pairs, +Inf last with the call count."""
    from prometheus_client.utils import floatToGoString
    out, acc = [], 0
    for b, c in zip(BOUNDS_NS, duration_buckets(s)):
        acc += c
        out.append((floatToGoString(b / 1e9), min(acc, s.calls)))
    out.append(("+Inf", s.calls))
    return out


def with_exemplars(s: StageStats, snap: Snapshot, cumulative: List[tuple]) -> List[tuple]:
    """The buckets of a top-level stage with its slowest calls as exemplars, the slowest one per bucket
    (OpenMetrics allows one exemplar per bucket; the text format 0.0.4 leaves them out)."""
    from prometheus_client.samples import Exemplar
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
            labels["stage"] = shown_path(top["path"])[:100]   # an exemplar's labels hold at most 128 characters
        ts = t0 + e["start_ns"] / 1e9 if isinstance(t0, (int, float)) else None
        out[le].append(Exemplar(labels, e["wall_ns"] / 1e9, ts))
    return [tuple(b) for b in out]


def _family(name: str) -> Any:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    kind, extra, _unit, doc = FAMILIES[name]
    labels = [] if extra is None else LABELS + extra
    cls = {"histogram": HistogramMetricFamily, "counter": CounterMetricFamily, "gauge": GaugeMetricFamily}[kind]
    return cls(name, doc, labels=labels)


def families(snap: Snapshot) -> List[Any]:
    fam = {name: _family(name) for name in FAMILIES}
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
            half = Z99 * s.cpu_var ** 0.5 if s.cpu_estimated else 0.0
            fam["instrument_stage_cpu_error_seconds"].add_metric(lab, half / 1e9)
            for part in SPLIT:
                v = s.split_part(part, self_=True)
                if v is not None:
                    fam["instrument_stage_wall_split_seconds"].add_metric(lab + [part], max(v, 0) / 1e9)
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
        for src in s.memory_sources:
            f = s.memory_of(src)
            if f and f["calls"]:
                fam["instrument_stage_memory_calls"].add_metric(lab + [src], f["calls"])
                fam["instrument_stage_memory_peak_bytes"].add_metric(lab + [src], f["peak_mean"])
                fam["instrument_stage_memory_net_bytes"].add_metric(lab + [src], f["net_mean"])
                if f["peak_max"] is not None:
                    fam["instrument_stage_memory_peak_max_bytes"].add_metric(lab + [src], f["peak_max"])
    fam["instrument_processes"].add_metric([], len(snap.meta.get("merged_from") or [None]))
    return list(fam.values())


class InstrumentCollector:
    """A prometheus_client collector: `source()` gives the Snapshot to expose at each scrape.

    Its counters never go down from one scrape to the next: an estimate (and a part of the wall-time split derived
    from estimates) can move down a little as reads come in, and a counter that goes down reads as a reset.  Each
    counter series keeps its highest value while its stage's call count does not go down (a reset of the
    recording, where it does, starts it again)."""

    def __init__(self, source: Callable[[], Snapshot]) -> None:
        client()
        if not callable(source):
            raise TypeError(f"source must be a function returning a Snapshot (such as instrument.snapshot), "
                            f"got {type(source).__name__}")
        self.source = source
        self._held: Dict[tuple, tuple] = {}   # (sample name, labels) -> (highest value, the stage's calls then)

    def describe(self) -> List[Any]:
        return []   # no samples taken at registration time

    def collect(self) -> Iterator[Any]:
        snap = self.source()
        calls = {(s.name, path_text(s.path)): s.calls for s in snap}
        for fam in families(snap):
            if fam.type == "counter":
                fam.samples = [self._monotone(smp, calls) for smp in fam.samples]
            yield fam

    def _monotone(self, smp: Any, calls: Dict[tuple, int]) -> Any:
        key = (smp.name, tuple(sorted(smp.labels.items())))
        n = calls.get((smp.labels.get("stage"), smp.labels.get("path")), 0)
        held = self._held.get(key)
        if held is not None and held[1] <= n and smp.value < held[0]:
            smp = smp._replace(value=held[0])
        self._held[key] = (smp.value, n)
        return smp


def _registry(snap: Snapshot) -> Any:
    from prometheus_client import CollectorRegistry
    reg = CollectorRegistry()
    reg.register(InstrumentCollector(lambda: snap))
    return reg


def render(snaps: Sequence[Snapshot], openmetrics: bool = False) -> str:
    """The Prometheus text exposition format (OpenMetrics, with exemplars, when asked).

    Several snapshots (the workers of one service) are merged: one set of series."""
    client()
    from prometheus_client import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    return (generate_openmetrics if openmetrics else generate_latest)(_registry(merged(snaps))).decode()


def write_textfile(path: str, snap: Snapshot) -> None:
    """Atomically, for node_exporter's textfile collector."""
    client()
    from prometheus_client import write_to_textfile
    write_to_textfile(path, _registry(snap))
