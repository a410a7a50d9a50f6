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
           "SnapshotError", "current_config", "profile", "serve_metrics", "__version__"]


def __getattr__(name):   # serve_metrics imports prometheus_client, so only when first used
    if name == "serve_metrics":
        from .exporters.prometheus import serve_metrics
        return serve_metrics
    raise AttributeError(f"module 'instrument' has no attribute {name!r}")
