"""The Snapshot: the one data model, by concern.

model.py     Snapshot and StageStats: the stage tree, its figures, fold; methods that call the modules below
schema.py    the file format: to and from JSON, each field checked on the way in, files read and written
merge.py     merge and window rules: recordings merged, since(), gpu and ops fields, exemplars
ranks.py     the ranks of a torch.distributed job: which rank, collective stages, figures per rank
base.py      the error, stage paths as text, the rules for numbers

A leaf: it imports nothing of the package but the histogram scheme.  The names below are its public face.
"""
from .base import SnapshotError, Z99, as_path, ci99, name_text, parse_path, path_shown, path_text
from .merge import (MAX_WINDOWS, OP_FIELDS, TOP_OPS, gpu_fields, join_windows, merge_all, merge_counters,
                    merge_estimate, merge_exemplars, merge_gpu, merge_items, merge_ops, merge_stage, ranked_ops,
                    since_stage)
from .model import QUANTILES, SPLIT, SWITCHES, Snapshot, StageStats, load, load_many
from .ranks import (COLLECTIVE_PREFIX, COLLECTIVES, RANK_FIELDS, RANK_KEY, is_collective, merge_ranks, rank_figures,
                    rank_of, since_ranks)
from .schema import EXEMPLAR_SPLIT, FORMAT, MAX_FILE_BYTES, VERSION, atomic_write

__all__ = [
    "COLLECTIVES", "COLLECTIVE_PREFIX", "EXEMPLAR_SPLIT", "FORMAT", "MAX_FILE_BYTES", "MAX_WINDOWS", "OP_FIELDS",
    "QUANTILES", "RANK_FIELDS", "RANK_KEY", "SPLIT", "SWITCHES", "Snapshot", "SnapshotError", "StageStats",
    "TOP_OPS", "VERSION", "Z99", "as_path", "atomic_write", "ci99", "gpu_fields", "is_collective", "join_windows",
    "load", "load_many", "merge_all", "merge_counters", "merge_estimate", "merge_exemplars", "merge_gpu",
    "merge_items", "merge_ops", "merge_ranks", "merge_stage", "name_text", "parse_path", "path_shown", "path_text",
    "rank_figures", "rank_of", "ranked_ops", "since_ranks", "since_stage",
]
