"""Formatting shared by every text form: numbers in their units, stage names
that cannot move the cursor or break a table, and the parts of each view that
the text table and markdown both show (the breakdown's columns, a diff's cells
and sentences, the tail's head line, the ranks' summary)."""
from __future__ import annotations

import bisect
import math
import textwrap
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import histogram as _hist
from ..analysis import metrics as _metrics
from ..analysis.diff import Change, Diff, DiffRow, metric_text as _figure
from ..analysis.metrics import Bar, Metric, ordered
from ..analysis.ranks import RankView
from ..analysis.significance import MAX_UNITS, Significance, needed
from ..analysis.tail import MEM_EXCESS, TailView
from ..analysis.verdict import with_verdicts
from ..snapshot import Snapshot, StageStats, path_shown
from . import Option, merged

MINUS = "\u2212"
ESTIMATE = "~"   # marks a figure estimated from the calls read under the overhead budget
UNKNOWN = "?"    # an estimate whose error bar is wider than its value: no figure worth reading


def ms(ns: Optional[float]) -> str:
    """Nanoseconds as milliseconds, with as many decimals as the size wants."""
    if ns is None:
        return "n/a"
    v = ns / 1e6
    if v >= 10000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.01:
        return f"{v:.3f}"
    return f"{v:.4f}"


def pct(x: Optional[float]) -> str:
    """A fraction as a percentage number (0.123 -> 12.3)."""
    if x is None:
        return "n/a"
    v = 100 * x
    return f"{0.0 if round(v, 1) == 0 else v:.1f}"   # no "-0.0"


def ratio(x: Optional[float], digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if digits == 2 and x >= 9.995:   # keep to four characters
        return f"{x:.0f}" if x < 99.5 else "99+"
    return f"{x:.{digits}f}"


def number(x: Optional[float]) -> str:
    """A small quantity with about three digits: 0.25, 2.5, 250."""
    if x is None:
        return "n/a"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def human(ns: Optional[float]) -> str:
    """Three significant digits: 25.0 ms, 1.23 s, 850 µs."""
    if ns is None:
        return "n/a"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            break
    else:
        unit, scale = "ns", 1
    v = ns / scale
    digits = max(0, 2 - int(math.floor(math.log10(abs(v))))) if v else 0
    return f"{v:.{digits}f} {unit}"


def signed_percent(r: Optional[float]) -> str:
    """A ratio after/before as a signed change: 0.9 -> −10.0%."""
    if r is None:
        return "n/a"
    x = (r - 1) * 100
    sign = "+" if round(x, 1) > 0 else MINUS if round(x, 1) < 0 else "±"
    return f"{sign}{abs(x):.1f}%"


def count(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:,.0f}" if float(x).is_integer() else f"{x:.4g}"


def printable(name: str) -> str:
    """Control characters shown escaped, so a stage name cannot move the cursor."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def md(text: str) -> str:
    """Text for a markdown table cell (a backslash doubled, so a '\\' in a name stays shown)."""
    return (printable(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
            .replace(">", "&gt;"))


def path_text(path: Sequence[str]) -> str:
    """A path for display: names as written joined by '/', a name holding a '/' quoted
    (instrument.snapshot.path_shown), control characters shown escaped."""
    return printable(path_shown(path))


def name(n: str) -> str:
    """One stage name for display, as written (the table shows nesting by indentation)."""
    return printable(n)


def unit(name: str) -> str:
    """An item name as a unit: tokens -> token, bytes -> byte, padding_tokens -> padding_token."""
    return name[:-1] if len(name) > 1 and name.endswith("s") and not name.endswith("ss") else name


def per_unit(ns: Optional[float], name: str) -> str:
    """Time per item: `2.51 µs/token`."""
    return "n/a" if ns is None else f"{human(ns)}/{printable(unit(name))}"


def si(x: Optional[float]) -> str:
    """A count with a metric prefix: 398000 -> 398k, 1234567 -> 1.23M."""
    if x is None:
        return "n/a"
    for p, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            v = x / scale
            break
    else:
        p, v = "", x
    digits = max(0, 2 - int(math.floor(math.log10(abs(v))))) if v else 0
    return f"{v:.{digits}f}{p}"


def rate(per_s: Optional[float], name: str) -> str:
    """Items per second: `398k tokens/s`."""
    return "n/a" if per_s is None else f"{si(per_s)} {printable(name)}/s"


TIME_COUNTERS = ("task-clock", "cpu-clock")   # perf events that count nanoseconds


def counter_text(event: str, value: Optional[float]) -> str:
    """A perf counter's total in its unit: `10.8 s` for a clock, `1.23M` for a large count, `840` for a small one."""
    if value is None:
        return "n/a"
    if event in TIME_COUNTERS:
        return human(value)
    return f"{value:,.0f}" if abs(value) < 10_000 else si(value)   # events are whole: an estimate's fraction is noise


SPLIT_SHORT = {"on_cpu": "cpu", "runqueue": "runq", "blocked": "blocked", "gil": "gil", "awaiting": "await",
               "loop_ready": "loop", "unknown": "unread"}


def dominant(parts: Optional[Mapping[str, float]]) -> str:
    """The largest of a split's shares, as a short name and a percentage: `runq 61%`; n/a without a split."""
    if not parts:
        return "n/a"
    part, share = max(parts.items(), key=lambda kv: kv[1])
    return f"{SPLIT_SHORT.get(part, part)} {100 * share:.0f}%"


#: the format kinds of instrument.analysis.metrics: a value's text by kind
KINDS: Dict[str, Callable[[Any], str]] = {
    "ms": ms, "pct": pct, "ratio": ratio, "ratio1": lambda x: ratio(x, 1), "int": lambda x: f"{x:.0f}",
    "number": number, "text": lambda x: printable(str(x)), "mib": lambda x: f"{x / 2 ** 20:.1f}",
}


def metric_text(kind: str, value: Any) -> str:
    """A metric's value as text: `n/a` where not measured (text: empty), a Bar as `12.3±0.4` (UNKNOWN where its
    error exceeds its value), components as `on_cpu 12.0 queue 3.0`."""
    if value is None:
        return "" if kind == "text" else "n/a"
    if isinstance(value, Bar):
        if value.error > abs(value.value):
            return UNKNOWN
        return f"{metric_text(kind, value.value)}\u00b1{metric_text(kind, value.error)}"
    if isinstance(value, Mapping):
        return " ".join(f"{printable(str(k))} {metric_text(kind, v)}" for k, v in value.items())
    return KINDS[kind](value)


#: the duration buckets of the Prometheus and OTel formats: le is inclusive and times are integer ns, so
#: 2**k - 1 == "below 2**k", and no bucket of the snapshot's histogram straddles one
DURATION_BOUNDS_NS = [(1 << k) - 1 for k in range(10, 37)]


def duration_buckets(s: StageStats) -> List[int]:
    """A stage's calls in each bucket of DURATION_BOUNDS_NS (not cumulative), those above the last at the end."""
    out = [0] * (len(DURATION_BOUNDS_NS) + 1)
    for i, c in s.hist.items():
        out[bisect.bisect_left(DURATION_BOUNDS_NS, _hist.bounds(i)[1] - 1)] += c
    return out


def cell(m: Metric, snap: Snapshot, s: StageStats) -> str:
    """A stage's figure as a table shows it, marked with ESTIMATE when estimated from sampled calls."""
    text = metric_text(m.kind, m.value(snap, s))
    return ESTIMATE + text if text not in ("", "n/a", UNKNOWN) and m.estimated(s) else text


# ------------------------------------------------------------------ breakdown
def _depth(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return int(text)


#: the options of the breakdown, which the table, markdown, CSV and JSON formats share
BREAKDOWN_OPTIONS = (
    Option("sort", f"siblings in tree order, by name, or by a metric, largest first: {', '.join(_metrics.sort_keys())}",
           metavar="KEY"),
    Option("depth", "only stages at most this deep", metavar="N", parse=_depth),
    Option("fold", "one row per stage name wherever it nested"))
NAME_MIN = 14                    # the stage name column narrows to this before a core column is left out
NAME_MAX = 40                    # and is never wider
NAME_WANT = 20                   # core columns give way before the names (up to this wide) are cut
DROPPABLE = ("cpu_per_wall", "self", "mean", "tail", "root", "p50")   # core columns left out, in this order, when
#                                                                       the terminal is too narrow (the median last)


def breakdown(snaps: Sequence[Snapshot], sort: str = "tree", depth: Optional[int] = None,
              fold: bool = False) -> Tuple[Snapshot, List[StageStats]]:
    """The snapshot a breakdown shows (`snaps` merged, with verdicts, maybe folded) and its rows in order."""
    if depth is not None and (not isinstance(depth, int) or depth < 1):
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    snap = with_verdicts(merged(snaps))
    if fold:
        snap = snap.fold()
    return snap, ordered(snap, sort, depth)


def label(s: StageStats, width: Optional[int] = None) -> str:
    """A stage's name as the first column shows it: indented by its depth, cut to `width` with '…'."""
    text = "  " * s.depth + name(s.name)
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def choose_columns(snap: Snapshot, width: Optional[int], names: Optional[Sequence[str]] = None,
            width_of: Callable[[Metric], int] = lambda m: m.column_width):
    """The columns (metrics) that fit `width` (each `width_of(metric)` wide), and those with data that did not fit."""
    if names:
        by: Dict[str, Metric] = {}
        for m in _metrics.METRICS.values():
            by.update({m.header.lower(): m, m.field: m, m.name: m})
        bad = [n for n in names if n.lower() not in by]
        if bad:
            raise ValueError(f"unknown column {', '.join(bad)}; the columns are: "
                             f"{', '.join(m.name for m in _metrics.METRICS.values())}")
        return [by[n.lower()] for n in names], []
    shown = _metrics.wanted(snap)
    cols = [m for m in shown if m.core]
    extra = [m for m in shown if not m.core]
    if width is None:
        return cols + extra, []
    dropped = []
    longest = max((len(label(s)) for s in snap), default=0)
    name_w = max(NAME_MIN, min(NAME_WANT, longest))
    for col in DROPPABLE:
        if name_w + sum(width_of(m) + 1 for m in cols) > width:
            dropped += [m for m in cols if m.name == col]
            cols = [m for m in cols if m.name != col]
    used = max(16, min(NAME_MAX, longest)) + sum(width_of(m) + 1 for m in cols)   # names stay whole if they can
    for m in extra:
        if used + width_of(m) + 1 <= width:
            cols.append(m)
            used += width_of(m) + 1
        else:
            dropped.append(m)
    order = list(_metrics.METRICS.values())
    return sorted(cols, key=order.index), dropped


def item_names(snap: Snapshot) -> List[str]:
    return list(dict.fromkeys(n for s in snap for n in s.items))


def item_lines(s: StageStats, indent: str) -> List[str]:
    """`tokens: 8,000 in 400 adds · 2.51 µs/token · 398k tokens/s` for each item of the stage."""
    out = []
    for item, it in s.items.items():
        line = f"{indent}{printable(item)}: {count(it['total'])} in {count(it['calls'])} add{'s' if it['calls'] != 1 else ''}"
        if it["total"] and s.wall_total:
            line += f" · {per_unit(s.per_item_ns(item), item)} · {rate(s.item_rate(item), item)}"
        out.append(line)
    return out


def ops_lines(ops: Any, indent: str) -> List[str]:
    """The torch operators of a stage, as far as the record has them; device time
    only where a device ran (a CPU-only profile has none to show)."""
    if not isinstance(ops, dict):
        return []
    rows_of = {k: [r for r in (ops.get(k) or []) if isinstance(r, dict)] if isinstance(ops.get(k), list) else []
               for k in ("by_self_cpu", "by_device")}
    device = bool(ops.get("device_total_ns")) or any(r.get("device_ns") for rows in rows_of.values() for r in rows)
    out = []
    for key, title in (("by_self_cpu", "ops by self CPU"), ("by_device", "ops by device time")):
        rows = rows_of[key]
        if not rows:
            continue
        out.append(f"{indent}{title}:")
        for r in rows[:10]:
            op = printable(str(r.get("name", "?")))
            op = op if len(op) <= 40 else op[:39] + "…"
            line = f"{indent}  {op:<40} {r.get('calls', 0):>7} calls  {ms(r.get('self_cpu_ns')):>8} ms CPU"
            if device:
                line += f"  {ms(r.get('device_ns')):>8} ms device"
            out.append(line)
    if device:
        out.append(f"{indent}device total: {ms(ops['device_total_ns'])} ms" if ops.get("device_total_ns") is not None
                   else f"{indent}device total: n/a")
    return out


def with_ops(s: StageStats, indent: str) -> List[str]:
    """Under a stage's row in the operators view: its items, then its torch operators."""
    return item_lines(s, indent) + ops_lines(s.ops, indent)


def no_ops_note(snap: Snapshot, width: Optional[int]) -> str:
    """What the operators view adds where no operators were recorded (empty where some were)."""
    if any(s.ops for s in snap):
        return ""
    return "\n" + textwrap.fill("no torch operators in this snapshot: they are recorded inside `with "
                                "instrument.profile():` (torch.profiler) around the calls", width or 80)


# ------------------------------------------------------------------------ tail
def tail_head(v: TailView, snap: Optional[Snapshot]) -> str:
    """The lines above a root stage's tail table: its calls, the slow ones, and why they were slow."""
    q = f"p{v.quantile * 100:g}".replace(".", "")
    head = (f"Tail of {path_text(v.stage)}: {v.calls:,} calls, p50 {human(v.p50_ns)}, p99 {human(v.p99_ns)}; "
            f"{v.slow_calls} kept call{'s' if v.slow_calls != 1 else ''} at or above {q} ({human(v.threshold_ns)}), "
            f"mean {human(v.slow_mean_ns)}")
    if v.typical_mean_ns is not None:
        head += (f", against a typical call (mean of the middle half of {v.typical_calls} sampled) of "
                 f"{human(v.typical_mean_ns)}: {human(v.total_excess_ns)} more")
    why = v.sentence(snap)
    if why:
        head += f"\n{why[0].upper() + why[1:]}."
    return head


TAIL_HEADERS = ["stage", "slow ms", "typical ms", "excess ms", "share%", "grew most"]
NO_EXEMPLARS = ("No exemplars in this snapshot: record with the `exemplars` option above 0 (the default is 32) "
                "to see which stage slow calls lose their time in.")


def tail_cells(v: TailView, limit: Optional[int]) -> List[List[str]]:
    """A row of cells per stage of the tail (at most `limit`), largest excess first."""
    rows = v.excess[:limit] if limit else v.excess
    return [[path_text(e.path), ms(e.slow_ns), ms(e.typical_ns),
             ("+" if e.ns > 0 else MINUS if e.ns < 0 else "") + ms(abs(e.ns)), pct(e.share),
             ", ".join(([f"{e.component} +{ms(e.parts[e.component])}"] if e.component else [])
                       + ([f"peak +{e.mem_excess / 2 ** 20:.1f} MiB"] if (v.own_mem_excess(e) or 0) >= MEM_EXCESS
                          else []))]
            for e in rows]


# ------------------------------------------------------------------------ diff
DIFF_HEADERS = ["calls", "total ms", "→", "Δ ms", "Δ%", "mean ms", "→", "Δ%", "p50 Δ%", "p99 ms", "→", "Δ%",
                "CPU/call Δ%", "change"]
NOISE = "~"   # marks a change not shown to be beyond noise


def percent(c: Change) -> str:
    if c.ratio is None:
        return "n/a" if c.before is None or c.after is None or not c.after else "new"
    return signed_percent(c.ratio)


def relative(x: Optional[float]) -> str:
    """A relative change as a signed percentage: 0.1 -> +10.0%; unbounded ends as ∞."""
    if x is None:
        return "n/a"
    if x == float("inf"):
        return "+∞"
    return signed_percent(1 + x)


def _level(x: float) -> str:
    return f"{100 * x:.2f}".rstrip("0").rstrip(".") + "%"


def significance_text(sig: Significance, what: str = "typical call") -> str:
    """`CPU per call +11.2% (99.9% interval +10.4% … +12.0%, 40 turns)`."""
    if sig.basis == "none":
        return f"{what} untested ({sig.reason})"
    lo, hi = sig.interval or (None, None)
    return f"{what} {relative(sig.estimate)} ({_level(sig.level)} interval {relative(lo)} … {relative(hi)}, " \
           f"{_units(sig)})"


def _units(sig: Significance) -> str:
    return f"{sig.n[0]} turns" if sig.basis == "turns" else f"{sig.n[0]} → {sig.n[1]} {sig.basis}"


def blind_text(d: Diff, target: float, limit: int = 3) -> Optional[str]:
    """What could not have shown a rise of `target` (0.1: 10 %), and what would let it: `request/model CPU per call
    flags a rise from +80.4% (1 → 1 runs), not +10.0%: about 229 runs a side would (from the measured spread), or a
    reference stage (--reference STAGE) of the same calls`; None where every judged figure could."""
    blind = d.blind(target)
    if not blind:
        return None
    said = [f"{path_shown(r.path)} {_figure(k)} flags a rise from {relative(t.detectable)} "
            f"({_units(t)})" for r, k, t in blind[:limit]]
    more = f" (and {len(blind) - limit} more)" if len(blind) > limit else ""
    goals = [(needed(t, target), t, r) for r, k, t in blind]
    floor = max(t.min_change for _, _, t in blind)
    if target <= floor and floor <= d.min_change:
        fix = f"no number of runs would: {relative(target)} is within the smallest change claimed " \
              f"({relative(floor)}, --min-change)"
    elif target <= floor:
        fix = f"{relative(target)} is within the machine's change of speed between these runs ({relative(floor)}, " \
              "the smallest change of time claimed): runs on machines alike would, or a reference stage " \
              "(--reference STAGE) of the same calls"
    elif any(units is None for (units, _), _, _ in goals):
        fix = f"more than {MAX_UNITS} runs a side would be needed"
    else:
        units = max(u for (u, _), _, _ in goals)
        unit = {"turns": "turns", "windows": "windows a side"}.get(blind[0][2].basis, "runs a side")
        fix = f"about {units} {unit} would (from the measured spread)"
        if blind[0][2].n == (1, 1) and d.reference is None:
            fix += ", or a reference stage (--reference STAGE) of the same calls"
        if all(c is not None for (_, c), _, _ in goals):
            factor = max(c for (_, c), _, _ in goals)
            calls = max(max(r.metrics["calls"].before or 0, r.metrics["calls"].after or 0) for _, _, r in goals)
            fix += f", or {factor:.2g}× the calls a side (about {math.ceil(factor * calls):,})"
    return "; ".join(said) + more + f", not {relative(target)}: {fix}"


def judgement_text(r: DiffRow) -> str:
    """`slower beyond noise: CPU per call +23.5% (…)`, `within noise: …`, `untested: …`."""
    metric, sig = r.decision
    what = _figure(metric) if metric else "change"
    if sig.basis == "none":
        return f"untested: {sig.reason}"
    if metric in r.not_evidence:
        return f"not judged: {significance_text(sig, what)}, not evidence ({r.not_evidence[metric]})"
    word = r.judgement
    if word in ("slower", "faster", "mixed"):
        return f"{word} beyond noise: {significance_text(sig, what)}"
    return f"within noise: {significance_text(sig, what)}"


def headline(d: Diff) -> str:
    """One line on the top-level stage: `request: 25.0 ms → 18.1 ms (−27.6%); faster beyond noise: CPU per call
    −27.2% (99.9% interval …)`, or `…; within noise: …`."""
    top = d.row(d.stage) if d.stage else None
    if top is None:
        return "no stages on either side"
    stage = name(top.name)
    tot = top.metrics["total"]
    if top.status != "both":
        side = tot.before if top.status == "only before" else tot.after
        return f"{stage}: {top.status} ({human(side)} total)"
    mean, calls = top.metrics["mean"], top.metrics["calls"]
    if d.change_of != "mean":
        text = f"{stage}: total {human(tot.before)} → {human(tot.after)} ({percent(tot)})"
    else:
        text = f"{stage}: {human(mean.before)} → {human(mean.after)} ({percent(mean)})"
        if calls.before != calls.after:
            text += (f" per call; total {human(tot.before)} → {human(tot.after)} ({percent(tot)}) over "
                     f"{calls.before:.0f} → {calls.after:.0f} calls")
    return f"{text}; {judgement_text(top)}"


def _ms_or_dash(x: Optional[float]) -> str:
    return ms(x) if x is not None else "-"


def _int_or_dash(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def _signed_ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else ("+" if x > 0 else MINUS) + ms(abs(x))


def _marked(text: str, judged: bool) -> str:
    return text if judged or text in ("n/a", "new", "-") else NOISE + text


def _cpu_cell(r: DiffRow) -> str:
    t = r.tests.get("cpu")
    if t is None or t.estimate is None:
        return "-"
    return _marked(relative(t.estimate), t.significant)


def diff_cells(r: DiffRow) -> List[str]:
    """A diff row's cells under DIFF_HEADERS; a change not shown beyond noise marked with NOISE."""
    m = r.metrics
    calls = m["calls"]
    wall = r.tests.get("wall")
    timed = wall is not None and wall.significant and "wall" not in r.not_evidence   # wall judged beyond noise
    change = {"within noise": NOISE + "noise"}.get(r.judgement, r.judgement)
    return [f"{_int_or_dash(calls.before)}→{_int_or_dash(calls.after)}",
            _ms_or_dash(m["total"].before), _ms_or_dash(m["total"].after), _signed_ms(m["total"].delta),
            _marked(percent(m["total"]), timed) if calls.before == calls.after else percent(m["total"]),
            _ms_or_dash(m["mean"].before), _ms_or_dash(m["mean"].after),
            _marked(percent(m["mean"]), timed), _marked(percent(m["p50"]), timed), _ms_or_dash(m["p99"].before),
            _ms_or_dash(m["p99"].after), _marked(percent(m["p99"]), timed), _cpu_cell(r),
            "-" if r.status != "both" else change]


def diff_label(r: DiffRow) -> str:
    return path_text(r.path) + ("" if r.status == "both" else f" ({r.status})")


def diff_notes(r: DiffRow) -> List[str]:
    """Under a row: its bottleneck verdict, what judged it, wall time where the machine explains it, each
    counted figure per call and the counters no test judges."""
    lines = []
    if any(r.verdict):
        b, a = (v or "-" for v in r.verdict)
        lines.append(f"verdict: {b}" + ("" if a == b else f" → {a}"))
    if r.status == "both" and r.tests:
        lines.append(judgement_text(r))
    for k, t in r.tests.items():
        if k in ("cpu", "wall") or t is r.significance:
            continue
        if t.basis == "none":
            lines.append(f"{NOISE}{_figure(k)} untested ({t.reason})")
        else:
            lines.append(("" if t.significant else NOISE) + significance_text(t, _figure(k)))
    wall = r.tests.get("wall")
    if wall is not None and "wall" in r.not_evidence and wall.significant and wall is not r.significance:
        lines.append(f"{significance_text(wall)}: not evidence ({r.not_evidence['wall']})")
    for n, c in r.counters.items():
        if n in r.tests or n == "task-clock" or not (c.before or c.after):   # judged, CPU time, or never counted
            continue
        lines.append(f"{n}: {counter_text(n, c.before)} → {counter_text(n, c.after)} ({percent(c)}; "
                     "not judged: load moves it)")
    return lines


def legend(d: Diff) -> List[str]:
    tests = (f"each of the {d.tests} tests at {_level(1 - d.alpha / d.tests)}, so that all hold together at {_level(1 - d.alpha)} "
             "(Bonferroni)" if d.tests else "no figure of any stage could be tested")
    short, detail = basis_parts(d.basis_reason)
    return [f"basis: {short}", f"machine: {d.machine.line}",
            f"judged on CPU time, instructions, page faults, items and memory peaks per call first, wall time where the machine "
            f"does not explain it; {tests}",
            f"{NOISE} not shown beyond noise: the interval of the change includes no change or reaches within "
            f"±{d.min_change:.0%}, the smallest change claimed"] + [f"basis in full: {detail}"] * bool(detail) \
        + [f"warning: {w}" for w in d.warnings]


def basis_parts(reason: str) -> Tuple[str, str]:
    """A diff's basis_reason ("runs, the strongest ...: one run a side (two plain runs): how it is tested") as
    what the basis is, for above a table, and how it tests, for below it."""
    parts = reason.split(": ", 2)
    return ": ".join(parts[:2]), (parts[2] if len(parts) > 2 else "")


# ----------------------------------------------------------------------- ranks
def _ranks(rs: Sequence[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def ranks_summary(v: RankView) -> List[str]:
    """The ranks view's headline sentences: ranks, missing and stopped ranks, the straggler."""
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
