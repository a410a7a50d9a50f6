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


def profile(schedule=None, record_shapes=False, activities=None, **kwargs):
    """torch.profiler.profile(...) whose events are also attributed to stages (instrument.torch_profiler)."""
    from .torch_profiler import profile as _profile
    return _profile(schedule=schedule, record_shapes=record_shapes, activities=activities, **kwargs)


__all__ = ["stage", "region", "snapshot", "report", "configure", "reset", "Snapshot", "StageStats",
           "SnapshotError", "current_config", "profile", "__version__"]
