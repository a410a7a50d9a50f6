"""instrument: where the time of an inference service goes, per stage.

    import instrument

    TOKENIZE = instrument.stage("tokenize")

    @instrument.region
    def preprocess(texts): ...

    with instrument.stage("request"):
        with TOKENIZE:
            ...
    instrument.report()
"""
from ._collector import __version__, configure, current_config, region, report, reset, snapshot, stage
from .snapshot import Snapshot, SnapshotError, StageStats

__all__ = ["stage", "region", "snapshot", "report", "configure", "reset", "Snapshot", "StageStats",
           "SnapshotError", "current_config", "__version__"]
