"""The ranks of a torch.distributed job as text (`instrument report --ranks`) or JSON (`--json`):
which ranks are there, the straggler and the wait it caused, each stage's spread over the ranks,
and a stage x rank table of time per step."""
from __future__ import annotations

import json
import textwrap
from typing import List, Optional, Sequence

from ..analysis.ranks import RankView, StageAcrossRanks
from .format import ms, name, path_text, pct

FORMATS = ("table", "json")
WIDTH = 80


def _ranks(rs: Sequence[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def summary(v: RankView) -> List[str]:
    """The view's headline sentences: ranks, missing and stopped ranks, the straggler."""
    hosts = len(set(v.hosts.values())) or 1
    of = f" of a world of {v.world_size}" if v.world_size else ""
    out = [f"Ranks: {len(v.ranks)}{of} on {hosts} host{'s' if hosts != 1 else ''}"
           + (f"; steps are calls of {path_text(v.step_path)}" if v.step_path else "") + "."]
    if v.missing:
        out.append(f"Missing: {_ranks(v.missing)}: no snapshot (the process died before writing one, or its file "
                   "was not given).")
    if v.stopped:
        most = max(v.steps.values())
        out.append("Stopped early: " + "; ".join(f"rank {r} after {v.steps[r]} of {most} steps" for r in v.stopped)
                   + " (killed, crashed, or not finished when its snapshot was taken).")
    if v.failed:
        out.append("Calls that raised: " + "; ".join(
            f"{path_text(p)} on " + ", ".join(f"rank {r} ({n})" for r, n in d.items()) for p, d in v.failed.items())
            + ".")
    s = v.straggler
    if s is None:
        out.append("Straggler: none (one rank, or no stage ran on more than one).")
        return out
    line = (f"Straggler: rank {s.rank} in {path_text(s.path)}, +{ms(s.excess_ns)} ms per step of its own time over "
            f"the other ranks' median" + (f" ({pct(s.step_share)}% of a step)" if s.step_share is not None else ""))
    if s.collective is not None and s.waits:
        line += (f"; the other ranks waited {ms(s.wait_ns)} ms per step (median of {len(s.waits)}) in "
                 f"{path_text(s.collective)} beyond its own time there")
    elif s.collective is None:
        line += "; no collective follows it"
    out.append(line + ".")
    return out


def _label(x: StageAcrossRanks) -> str:
    return "  " * (len(x.path) - 1) + name(x.path[-1]) + ("ᵍ" if x.device else "")


def _table(header: List[str], rows: List[List[str]], first: int) -> List[str]:
    widths = [first] + [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header) if i]

    def line(cells):
        c0 = cells[0] if len(cells[0]) <= first else cells[0][:first - 1] + "…"
        return (f"{c0:<{first}}" + "".join(f"  {c:>{w}}" for c, w in zip(cells[1:], widths[1:]))).rstrip()
    return [line(header), "-" * (sum(widths) + 2 * (len(widths) - 1))] + [line(r) for r in rows]


def render(view: RankView, format: str = "table", width: Optional[int] = WIDTH) -> str:
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if format == "json":
        return json.dumps(view.to_dict(), indent=2, allow_nan=False)
    width = width or WIDTH
    out = [w for line in summary(view) for w in textwrap.wrap(line, width, subsequent_indent="  ")]
    first = min(36, max(len(_label(x)) for x in view.stages) if view.stages else 10)
    spread = [[_label(x), ms(x.low), ms(x.median), ms(x.high), str(x.slowest) if x.high > x.low else "",
               ms(x.mean_wait) if x.wait is not None else ""] for x in view.stages]
    out += [""] + _table(["ms per step", "min", "median", "max", "slowest", "mean wait"], spread, first)
    cell = max([8] + [len(ms(v)) + 1 for x in view.stages for v in x.per_step.values()])
    fit = max(1, (width - first) // (cell + 2))
    shown = list(view.ranks[:fit])
    grid = [[_label(x)] + [("" if r not in x.per_step else ("*" if r == x.slowest and x.high > x.low else "")
                            + ms(x.per_step[r])) for r in shown] for x in view.stages]
    out += [""] + _table(["ms per step"] + [f"rank {r}" for r in shown], grid, first)
    notes = ["* the slowest rank"]
    if any(x.device for x in view.stages):
        notes.append("ᵍ device time (CUDA events)")
    if len(view.ranks) > len(shown):
        notes.append(f"ranks {view.ranks[len(shown)]}..{view.ranks[-1]} left out for the width (--json has all)")
    out.append("(" + "; ".join(notes) + ")")
    return "\n".join(out)
