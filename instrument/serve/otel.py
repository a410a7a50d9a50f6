"""Optional OpenTelemetry bridge: stage durations into an OTel histogram.

    from instrument.serve import otel
    bridge = otel.OTelBridge(meter, source=instrument.snapshot)   # meter: default the global provider's
    bridge.record()                     # call periodically: records what is new since the previous call
    bridge.start(10.0)                  # or: a daemon thread doing it every 10 s

The instruments, their attributes and bucket edges are those of the OTLP
exporter (instrument.exporters.otel), which writes a snapshot as OTLP/JSON without
a meter.  Each call is recorded at its histogram bucket's midpoint (within
0.78 %), so the OTel counts equal the snapshot's calls exactly.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Tuple

from .._version import __version__
from ..exporters.otel import BOUNDS_S, DURATION, ERRORS, SCOPE, attributes, value_s
from ..snapshot import Snapshot


class OTelBridge:
    def __init__(self, meter: Any = None, source: Optional[Callable[[], Snapshot]] = None) -> None:
        self.source = source
        if meter is None:
            from opentelemetry import metrics
            meter = metrics.get_meter(SCOPE, __version__)
        kw = dict(unit=DURATION.unit, description=DURATION.description)
        try:
            self.duration = meter.create_histogram(DURATION.name, explicit_bucket_boundaries_advisory=BOUNDS_S, **kw)
        except TypeError:   # opentelemetry-api before 1.23 has no bucket advice
            self.duration = meter.create_histogram(DURATION.name, **kw)
        self.errors = meter.create_counter(ERRORS.name, unit=ERRORS.unit, description=ERRORS.description)
        self._seen: Dict[Tuple[str, ...], Tuple[int, int, Dict[int, int]]] = {}
        self._lock = threading.Lock()
        self._stop: Optional[threading.Event] = None

    def record(self, snap: Optional[Snapshot] = None) -> int:
        """Record the calls added since the previous call (all of them the first
        time; a stage whose count went down is taken as reset); returns how many."""
        if snap is None:
            if self.source is None:
                raise ValueError("OTelBridge.record() needs a Snapshot, or a bridge made with source= "
                                 "(such as instrument.snapshot)")
            snap = self.source()
        n = 0
        with self._lock:
            for s in snap:
                calls, errors, hist = self._seen.get(s.path, (0, 0, {}))
                if s.calls < calls:
                    calls, errors, hist = 0, 0, {}
                attrs = attributes(s)
                for i, c in sorted(s.hist.items()):
                    k = c - hist.get(i, 0)
                    if k > 0:
                        v = value_s(s, i)
                        for _ in range(k):
                            self.duration.record(v, attrs)
                        n += k
                if s.errors > errors:
                    self.errors.add(s.errors - errors, attrs)
                self._seen[s.path] = (s.calls, s.errors, dict(s.hist))
        return n

    def start(self, interval: float = 10.0) -> None:
        """Record every `interval` seconds in a daemon thread until stop()."""
        self.stop()
        ev = self._stop = threading.Event()

        def loop() -> None:
            while not ev.wait(interval):
                try:
                    self.record()
                except Exception:
                    pass   # a failing exporter must not take the service down
        threading.Thread(target=loop, name="instrument-otel", daemon=True).start()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None


_bridges: Dict[int, Tuple[Any, OTelBridge]] = {}


def record(snap: Snapshot, meter: Any = None) -> int:
    """Record `snap` through one bridge per meter, so repeated calls record only what is new."""
    key = id(meter)
    if key not in _bridges or _bridges[key][0] is not meter:
        _bridges[key] = (meter, OTelBridge(meter))
    return _bridges[key][1].record(snap)
