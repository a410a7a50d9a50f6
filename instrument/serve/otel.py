"""Optional OpenTelemetry bridge: stage durations into an OTel histogram.

    from instrument.serve import otel
    bridge = otel.OTelBridge(meter, source=instrument.snapshot)   # meter: default the global provider's
    bridge.record()                     # call periodically: records what is new since the previous call
    bridge.start(10.0)                  # or: a daemon thread doing it every 10 s

Instruments: `instrument.stage.duration` (histogram, unit "s") and
`instrument.stage.errors` (counter), attributes `stage` and `path` (names joined by
'/', a '/' or '\\' inside a name escaped with '\\').  Each call
is recorded at its histogram bucket's midpoint (within 0.78 %), so the OTel
counts equal the snapshot's calls exactly.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Tuple

from .. import histogram as _hist
from .._version import __version__
from ..snapshot import Snapshot, path_text

BOUNDS_S = [((1 << k) - 1) / 1e9 for k in range(10, 37)]   # the same edges as the Prometheus exporter


class OTelBridge:
    def __init__(self, meter: Any = None, source: Optional[Callable[[], Snapshot]] = None) -> None:
        self.source = source
        if meter is None:
            from opentelemetry import metrics
            meter = metrics.get_meter("instrument", __version__)
        kw = dict(unit="s", description="Wall time of completed calls of a stage")
        try:
            self.duration = meter.create_histogram("instrument.stage.duration", explicit_bucket_boundaries_advisory=BOUNDS_S,
                                                   **kw)
        except TypeError:   # opentelemetry-api before 1.23 has no bucket advice
            self.duration = meter.create_histogram("instrument.stage.duration", **kw)
        self.errors = meter.create_counter("instrument.stage.errors", unit="{call}",
                                           description="Calls of a stage that exited by an exception")
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
                attrs = {"stage": s.name, "path": path_text(s.path)}
                for i, c in sorted(s.hist.items()):
                    k = c - hist.get(i, 0)
                    if k > 0:
                        v = _hist.midpoint(i)
                        v = min(max(v, s.wall_min if s.wall_min is not None else v),
                                s.wall_max if s.wall_max is not None else v) / 1e9
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
