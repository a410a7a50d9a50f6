"""The `instrument` command.

    instrument run [-o run.json] [--trace-events N] [--no-report] [--keep-parts] [--exit-zero-on-term] -- python ...
    instrument report FILE|DIR... [--sort total|self|calls|p99|cpu|...] [--depth N] [--fold] [--format FORMAT] [--ops]
    instrument report --tail [--quantile Q] [--json] FILE...  |  report --since EARLIER LATER [...]
    instrument diff BEFORE AFTER [--basis turns|windows|runs] [--reference STAGE] [--fail-on-regression PCT]
                  [--on-inconclusive pass|fail]
                  [--summary FILE] [--format ...]
    instrument merge FILE... -o all.json
    instrument export --FORMAT OUT FILE... [the format's options]     (FORMAT: instrument.exporters.formats())
    instrument top URL [--interval S] [--sort KEY] [--once] [--json]
    instrument doctor [--json] | nsys ... | demo ... | advise ...

Errors are one line on stderr (`instrument: <what>: <why>`) and exit status 2.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import config
from ._version import __version__
from .analysis.advice import advise
from .analysis.diff import BASES, REGRESSIONS, diff, metric_text
from .analysis.metrics import sort_keys
from .analysis.ranks import rank_view
from .analysis.tail import tail
from .analysis.verdict import with_verdicts
from .exporters import ADVICE, DIFF, OPERATORS, RANKS, TAIL, View, formats
from .exporters.format import blind_text, headline, path_text, ranks_summary, significance_text
from .serve import multiproc
from .snapshot import RANK_KEY, Snapshot, SnapshotError, atomic_write, merge_all, rank_of


class CLIError(Exception):
    """A one-line reason; the command exits 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):   # one line instead of argparse's usage block
        what = self.prog[len("instrument"):].strip()
        raise CLIError(f"{what + ': ' if what else ''}{message} (see `{self.prog} --help`)")


def _err(msg: str) -> None:
    print(f"instrument: {' '.join(str(msg).split())}", file=sys.stderr)


# ------------------------------------------------------------------ helpers
def _write(path: str, text: str) -> None:
    """`-` is stdout; a file is replaced atomically, so a failed export leaves the old one."""
    if path == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    try:
        atomic_write(path, text.encode("utf-8"))
    except OSError as e:
        raise CLIError(f"{path}: cannot write: {e.strerror or e}") from None


def _save(snap: Snapshot, path: str) -> None:
    if path == "-":
        sys.stdout.write(snap.to_json() + "\n")
        return
    try:
        snap.save(path)
    except OSError as e:
        raise CLIError(f"{path}: cannot write: {e.strerror or e}") from None


_VERSION_RE = re.compile(rb'^\s*\{\s*"format"\s*:\s*"[^"]*"\s*,\s*"version"\s*:\s*(-?\d+)')


def declared_version(path: str) -> Optional[int]:
    """The "version" a file declares, read from its head (where save() puts it)."""
    try:
        with open(path, "rb") as f:
            m = _VERSION_RE.match(f.read(512))
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _check_versions(paths: Sequence[str]) -> None:
    seen: Dict[int, str] = {}
    for p in paths:
        v = declared_version(p)
        if v is not None:
            seen.setdefault(v, p)
    if len(seen) > 1:
        (va, pa), (vb, pb) = sorted(seen.items())[:2]
        raise CLIError(f"merge: {pa} is snapshot version {va} but {pb} is version {vb}; "
                       "files of different schema versions are not merged")


class _Progress:
    """`merging 37/120` on stderr: rewritten in place on a terminal, every 10 % otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.step = max(1, total // 10)

    def __call__(self, k: int) -> None:
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write(f"\rinstrument: merging {k}/{self.total}")
            if k == self.total:
                sys.stderr.write("\n")
        elif k % self.step == 0 or k == self.total:
            sys.stderr.write(f"instrument: merging {k}/{self.total}\n")
        sys.stderr.flush()


def _files(paths: Sequence[str]) -> List[str]:
    """The paths, each folder replaced by the snapshot files in it (.snap files of the snapshot writer, .json)."""
    out: List[str] = []
    for p in paths:
        if not os.path.isdir(p):
            out.append(p)
            continue
        found = multiproc.files(p)
        if not found:
            raise CLIError(f"{p}: a folder with no snapshot files (instrument-*.snap, *.json) in it")
        out += found
    return out


def _read(path: str) -> Snapshot:
    """A snapshot file, or the newest whole snapshot of a process's .snap file (the snapshot writer's)."""
    if not path.endswith(".snap"):
        return Snapshot.load(path)
    snap = multiproc.read(path)
    if snap is None:
        raise CLIError(f"{path}: its process had written no snapshot into it yet")
    return snap


def _load_all(paths: Sequence[str], progress: bool = False) -> Snapshot:
    paths = _files(paths)
    _check_versions(paths)
    p = _Progress(len(paths), progress and len(paths) >= 10)
    return merge_all((_read(f) for f in paths), p)


def by_rank(paths: Sequence[str], cmd: str) -> Tuple[Snapshot, List[str]]:
    """The per-rank merge of snapshot files of one job's ranks, checked: every file names its rank (or merges
    ranks, and maybe the launcher's process) and all are of one world size.  Of several snapshots of one
    process (its snapshot writer's file and its exit-time part) the latest is kept: a process's snapshots
    only grow.  Files left out are returned: those earlier snapshots, and files that name no rank and hold
    no calls (the launcher's own process)."""
    paths = _files(paths)
    _check_versions(paths)
    singles: Dict[tuple, Tuple[str, Snapshot]] = {}   # process -> its latest snapshot
    merges: List[Tuple[str, Snapshot, List[tuple]]] = []
    left: List[str] = []
    worlds: Dict[int, str] = {}
    for p in paths:
        snap = _read(p)
        m = snap.meta
        procs = m.get("merged_from") or [dict(m.get(RANK_KEY) or {}, rank=rank_of(m), pid=m.get("pid"),
                                              host=m.get("host"), start_time=m.get("start_time"))]
        if all(x.get("rank") is None for x in procs) if m.get("merged_from") else procs[0]["rank"] is None:
            if not any(s.calls for s in snap.stages):
                left.append(p)
                continue
            raise CLIError(f"{cmd}: {p} names no rank (not recorded by a rank of a torch.distributed job or under "
                           "torchrun); leave it out, or merge without --by-rank")
        for x in procs:
            if isinstance(x.get("world_size"), int):
                worlds.setdefault(x["world_size"], p)
        keys = [(x.get("pid"), x.get("host"), x.get("start_time")) for x in procs]
        if m.get("merged_from"):
            merges.append((p, snap, keys))
            continue
        prev = singles.get(keys[0])
        if prev is not None and (m.get("duration_ns") or 0) <= (prev[1].meta.get("duration_ns") or 0):
            left.append(p)
            continue
        if prev is not None:
            left.append(prev[0])
        singles[keys[0]] = (p, snap)
    owner = {k: p for k, (p, _) in singles.items()}
    for p, _, keys in merges:
        for k in keys:
            if k in owner:
                raise CLIError(f"{cmd}: {p} merges process {k[0]}, which {owner[k]} holds too: give the merge or its "
                               "parts, not both")
            owner[k] = p
    if len(worlds) > 1:
        (wa, pa), (wb, pb) = sorted(worlds.items())[:2]
        raise CLIError(f"{cmd}: {pa} is of a world of {wa} ranks but {pb} of {wb}: files of different jobs")
    kept = [snap for _, snap in singles.values()] + [snap for _, snap, _ in merges]
    if not kept:
        raise CLIError(f"{cmd}: none of the files names a rank (record under torchrun, or with torch.distributed "
                       "initialised)")
    return merge_all(kept), left



def _rest(cmd: List[str]) -> List[str]:
    return cmd[1:] if cmd[:1] == ["--"] else cmd


# ------------------------------------------------------------------- report
def _window(earlier: str, later: str) -> Snapshot:
    """What happened between two snapshot files of one process (Snapshot.since)."""
    a, b = Snapshot.load(earlier), Snapshot.load(later)
    try:
        return b.since(a)
    except SnapshotError as e:
        why = str(e).removeprefix("since: ")
        if "taken after this one" in why:
            why = f"{earlier} was taken after {later}; give the earlier snapshot first"
        raise CLIError(f"report --since: {why}") from None


def _cmd_report(a) -> int:
    if a.since and a.files:
        raise CLIError("report: --since EARLIER LATER reads those two files only; give no other FILE")
    if not a.since and not a.files:
        raise CLIError("report: no snapshot file given; usage: instrument report FILE... or --since EARLIER LATER")
    if a.quantile is not None and not a.tail:
        raise CLIError("report: --quantile goes with --tail")
    if a.ranks:
        return _report_ranks(a)
    snap = with_verdicts(_window(*a.since) if a.since else _load_all(a.files))   # a folder: its snapshots merged
    fmt = "json" if a.json else a.format
    given = {k: v for k, v in (("sort", a.sort), ("depth", a.depth), ("fold", a.fold)) if v not in (None, False)}
    if a.tail:
        _view_format(TAIL, fmt, "report --tail")
        q = 0.99 if a.quantile is None else a.quantile
        print(TAIL.render(tail(snap, q), fmt, snap=snap))
        return 0
    if a.ops:
        _view_format(OPERATORS, fmt, "report --ops")
        print(OPERATORS.render(snap, fmt, **given))
    else:
        f = formats()[fmt]
        stray = _stray_option(f, given)
        if stray:
            raise CLIError(f"report: --{stray[0]} goes with --format {_either(stray[1])}, not {fmt}")
        print(_render(f, [snap], f"report: --format {fmt}", a.files or a.since, given))
    if fmt == "table":
        if a.since:
            w = snap.meta.get("window") or {}
            print(f"window: {(w.get('duration_ns') or 0) / 1e9:.3f} s between the two snapshots")
        print()
        about = f"{a.since[1]} since {a.since[0]}" if a.since else ", ".join(a.files)
        print(ADVICE.render(advise(snap), "table", about=about, width=_terminal_width()))
    return 0


def _either(names: Sequence[str]) -> str:
    """`table, json or markdown`."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _stray_option(fmt, given: Dict[str, Any]) -> Optional[Tuple[str, List[str]]]:
    """The first option given that `fmt` does not take, and the formats that take it; None when it takes all."""
    stray = sorted(set(given) - {o.name for o in fmt.options})
    if not stray:
        return None
    return stray[0], [f.name for f in formats().values() if any(o.name == stray[0] for o in f.options)]


def _view_format(view: View, fmt: str, what: str) -> None:
    if fmt not in view.formats():
        raise CLIError(f"{what}: --format {fmt} is not available; use {_either(view.formats())}")


def _render(fmt, snaps: List[Snapshot], where: str, files: Sequence[str], options: Dict[str, Any]) -> str:
    """`fmt.render(snaps, **options)`; a missing package or a bad input is a CLIError saying `where` (the command
    and the flag) and, for a bad input, the files."""
    try:
        return fmt.render(snaps, **options)
    except ImportError as e:
        raise CLIError(f"{where}: {e}") from None
    except ValueError as e:
        if isinstance(e, SnapshotError):
            raise
        raise CLIError(f"{where} {' '.join(files)}: {e}") from None


def _report_ranks(a) -> int:
    if a.since or a.tail or a.ops:
        raise CLIError("report: --ranks reads FILE... (a merge of ranks, or each rank's files); it does not go with "
                       "--since, --tail or --ops")
    fmt = "json" if a.json else a.format
    _view_format(RANKS, fmt, "report --ranks")
    snap = by_rank(a.files, "report --ranks")[0]
    try:
        view = rank_view(snap)
    except ValueError as e:
        raise CLIError(f"report --ranks: {', '.join(a.files)}: {e}") from None
    print(RANKS.render(view, fmt))
    return 0


# --------------------------------------------------------------------- diff
def _diff_options(a) -> Dict[str, float]:
    try:
        opts = config.diff_options(config.from_env(strict=True))
    except ValueError as e:
        raise CLIError(f"diff: {e}") from None
    if a.alpha is not None:
        opts["alpha"] = a.alpha
    if a.min_change is not None:
        opts["min_change"] = a.min_change / 100
    return opts


def _regression_text(r, figure: str, t) -> str:
    return f"{path_text(r.path)} {significance_text(t, metric_text(figure))}"


def _terminal_width() -> int:
    """The width text output fits, as the report's table: the terminal's (COLUMNS), at least 80."""
    return max(80, shutil.get_terminal_size((80, 24)).columns)


def _cmd_diff(a) -> int:
    try:
        d = diff(Snapshot.load(a.before), Snapshot.load(a.after), basis=a.basis, reference=a.reference,
                 **_diff_options(a))
    except ValueError as e:
        if isinstance(e, SnapshotError):
            raise
        raise CLIError(f"diff: {e}") from None
    for w in d.warnings:
        _err(f"diff: {w}")
    print(DIFF.render(d, a.format, **({"width": _terminal_width()} if a.format == "table" else {})))
    summary = dict(d.to_dict(), headline=headline(d))
    code = 0
    if a.fail_on_regression is not None:
        code = _gate(d, a.fail_on_regression, a.on_inconclusive, summary)
    if a.summary:
        _write(a.summary, json.dumps(summary, indent=2, allow_nan=False))
    return code


INCONCLUSIVE = 3   # the gate's exit status where some judged figure could not have shown the change asked about


def _gate(d, pct_asked: float, on_inconclusive: Optional[str], summary: Dict[str, Any]) -> int:
    """--fail-on-regression: 1 for a regression beyond noise and over PCT; 0 where none and every judged figure
    could have shown PCT; else inconclusive (INCONCLUSIVE, or 0 / 1 as --on-inconclusive asks)."""
    pct = pct_asked / 100
    found, blind = d.regressions(pct), d.blind(pct)
    judged = any(k in REGRESSIONS for r in d.rows for k, _ in r.judged)
    outcome = "failed" if found else "inconclusive" if blind or not judged else "passed"
    summary["gate"] = {"fail_on_regression_pct": pct_asked, "failed": bool(found), "outcome": outcome,
                       "regressions": [{"path": list(r.path), "figure": k, "estimate": t.estimate,
                                        "interval": t.interval_list()} for r, k, t in found],
                       "blind": [{"path": list(r.path), "figure": k, "detectable": t.to_dict()["detectable"]}
                                 for r, k, t in blind]}
    if found:
        _err(f"diff: {len(found)} regression{'s' if len(found) != 1 else ''} beyond noise and over "
             f"{pct_asked:g}%: " + "; ".join(_regression_text(r, k, t) for r, k, t in found))
        return 1
    near = [f"{_regression_text(r, k, t)}: " + (f"not evidence ({r.not_evidence[k]})" if k in r.not_evidence
                                                 else "within noise")
            for r in d.rows for k, t in r.tests.items() if k in REGRESSIONS and t.estimate is not None
            and t.estimate > pct and not (t.significant and k not in r.not_evidence)]
    if near:
        _err(f"diff: over {pct_asked:g}% but not a regression beyond noise: "
             + "; ".join(near[:3]) + (f" (and {len(near) - 3} more)" if len(near) > 3 else ""))
    if outcome == "passed":
        return 0
    code = {"pass": 0, "fail": 1}.get(on_inconclusive or "", INCONCLUSIVE)
    why = blind_text(d, pct) if judged else "no figure per call was judged on both sides"
    _err(f"diff: inconclusive (exit {code}): could not have shown a regression of {pct_asked:g}%: {why}")
    return code


# -------------------------------------------------------------------- merge
def _cmd_merge(a) -> int:
    if a.by_rank:
        return _merge_by_rank(a)
    snap = _load_all(a.files, progress=True)
    _save(snap, a.output)
    if a.output != "-":
        _err(f"merge: {len(a.files)} files ({len(snap.meta.get('merged_from') or [0])} processes, "
             f"{len(snap)} stages) into {a.output}")
    return 0


def _merge_by_rank(a) -> int:
    snap, skipped = by_rank(a.files, "merge --by-rank")
    _save(snap, a.output)
    if a.output != "-":
        view = rank_view(snap)
        _err(f"merge --by-rank: {len(snap.meta['merged_from'])} processes into {a.output}: "
             f"{' '.join(ranks_summary(view)[:3])}"
             + (f" Left out (no rank and no calls, or an earlier snapshot of a process given again): "
                f"{', '.join(skipped)}" if skipped else ""))
    return 0


# ------------------------------------------------------------------- export
def _format_dest(name: str) -> str:
    return f"format_{name}"   # argparse dests of their own: a format or option name never meets another argument


def _option_dest(name: str) -> str:
    return f"option_{name}"


def _cmd_export(a) -> int:
    fmts = formats()
    fmt = next(f for f in fmts.values() if getattr(a, _format_dest(f.name)) is not None)
    out = getattr(a, _format_dest(fmt.name))
    given = {o.name: getattr(a, _option_dest(o.name)) for f in fmts.values() for o in f.options
             if getattr(a, _option_dest(o.name)) not in (None, False)}
    stray = _stray_option(fmt, given)
    if stray:
        raise CLIError(f"export: --{stray[0]} goes with {' or '.join('--' + n for n in stray[1])}, not --{fmt.name}")
    _check_versions(a.files)
    _write(out, _render(fmt, [Snapshot.load(f) for f in a.files], f"export: --{fmt.name}", a.files, given))
    return 0


# ---------------------------------------------------------------------- run
def parts_dir(output: str) -> str:
    """The folder beside `output` where each process of `instrument run` saves its part."""
    d, base = os.path.split(os.path.abspath(output))
    stem = base[:-5] if base.endswith(".json") else base
    return os.path.join(d, f"{stem}.parts")


def run_env(output: str, trace_events: int = 100_000, environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment that turns the SDK on in a program and every Python process
    it starts; each saves to `<stem>.parts/<stem>.<pid>.json` beside `output` (the
    folder is made here)."""
    os.makedirs(parts_dir(output), exist_ok=True)
    env = dict(os.environ if environ is None else environ)
    boot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
    env["PYTHONPATH"] = os.pathsep.join([boot] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(config.to_env(output=_pattern(output), trace_events=trace_events))
    return env


def _pattern(output: str) -> str:
    base = os.path.basename(os.path.abspath(output))
    stem = base[:-5] if base.endswith(".json") else base
    return os.path.join(parts_dir(output), f"{stem}.{{pid}}.json")


def _remove_parts(paths: Sequence[str], folder: str) -> bool:
    """Remove merged parts, then the folder when nothing else is in it; whether it went."""
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
    try:
        os.rmdir(folder)
        return True
    except OSError:
        return False


def _process_files(output: str) -> Dict[str, Tuple[int, int]]:
    pat = _pattern(output)
    rx = re.compile(re.escape(os.path.basename(pat)).replace(re.escape("{pid}"), r"\d+") + "$")
    found = {}
    for p in glob.glob(pat.replace("{pid}", "[0-9]*")):
        if rx.match(os.path.basename(p)):
            try:
                st = os.stat(p)
                found[p] = (st.st_ino, st.st_mtime_ns)
            except OSError:
                pass
    return found


def rank_output(output: str) -> str:
    """`output` of `instrument run`, named for the rank when a launcher (torchrun) started it as one rank of a
    job: run.json -> run.rank2.json (each rank writes its own; `instrument merge --by-rank` joins them)."""
    who = config.launcher_rank()
    if who is None:
        return output
    stem, ext = (output[:-5], ".json") if output.endswith(".json") else (output, "")
    return f"{stem}.rank{who['rank']}{ext}"


def _cmd_run(a) -> int:
    cmd = _rest(a.command)
    if not cmd:
        raise CLIError("run: no program given; usage: instrument run [-o run.json] -- python serve.py ...")
    out = a.output
    if out == "-":
        raise CLIError("run: -o - is not supported (stdout is the program's); give a file name")
    out = rank_output(out)
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise CLIError(f"run: {out}: the folder does not exist")
    try:
        config.from_env(dict(os.environ, **config.to_env(trace_events=a.trace_events)), strict=True)
    except ValueError as e:
        raise CLIError(f"run: {e}") from None
    try:
        env = run_env(out, a.trace_events)
    except OSError as e:
        raise CLIError(f"run: {parts_dir(out)}: cannot make the folder for the processes' parts: "
                       f"{e.strerror or e}") from None
    folder = parts_dir(out)
    before = _process_files(out)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as e:
        raise CLIError(f"run: cannot start {cmd[0]}: {e.strerror or e}") from None
    forwarded = {}

    def forward(signum, frame):
        try:
            proc.send_signal(signum)
        except OSError:
            pass
    if threading.current_thread() is threading.main_thread():   # signal.signal works only there
        for name in ("SIGTERM", "SIGHUP", "SIGQUIT"):
            sig = getattr(signal, name, None)
            if sig is not None:
                forwarded[sig] = signal.signal(sig, forward)
        # Ctrl-C reaches the program from the terminal itself; a second copy would interrupt its exit-time save
        forwarded[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc = proc.wait()
    finally:
        for sig, h in forwarded.items():
            signal.signal(sig, h)
    status = rc if rc >= 0 else 128 - rc   # killed by signal N: 128 + N, as a shell says it (SIGTERM: 143)
    if a.exit_zero_on_term and status == 128 + signal.SIGTERM:   # a service stopped as it should be
        status = 0
    produced = sorted((p for p, v in _process_files(out).items() if before.get(p) != v),
                      key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[-1]))
    if not produced:
        _remove_parts([], folder)
        _err(f"run: the program recorded no stage or wrote no snapshot (not Python, started with -I/-S/-E, or "
             f"ended by SIGKILL?); nothing written to {out}")
        return status
    snaps, merged_parts = [], []
    for p in produced:
        try:
            snaps.append(Snapshot.load(p))
            merged_parts.append(p)
        except SnapshotError as e:
            _err(f"run: skipped {e}")
    if not snaps:
        return status
    merged = merge_all(snaps)
    _save(merged, out)
    if not a.no_report:
        print(formats()["table"].render([merged]), file=sys.stderr)
        if any(st.ranks for st in merged.stages):
            print("\n" + RANKS.render(rank_view(merged)), file=sys.stderr)
    names = f"{', '.join(os.path.basename(p) for p in produced[:8])}{' …' if len(produced) > 8 else ''}"
    if a.keep_parts:
        where = f"; parts kept in {folder}"
    else:
        gone = _remove_parts(merged_parts, folder)
        where = "; parts removed" + ("" if gone else f", {folder} holds other files")
    _err(f"run: {out} (merged from {len(snaps)} process{'es' if len(snaps) != 1 else ''}: {names}{where})")
    return status


# ----------------------------------------------------------- other commands
def _cmd_doctor(a) -> int:
    from .live import doctor
    d = doctor.collect()
    print(json.dumps(d, indent=2, default=str) if a.json else doctor.format_text(d))
    return 0


def _cmd_nsys(a) -> int:
    from . import nsys
    cmd = _rest(a.command)
    if not cmd:
        raise CLIError("nsys: no program given; usage: instrument nsys [--dry-run] -- python serve.py ...")
    kw: Dict[str, Any] = {"dry_run": a.dry_run, "output": a.output}
    if a.capture is not None:
        kw["capture"] = a.capture
    if a.warmup is not None:
        kw["warmup"] = a.warmup
    return int(nsys.run(cmd, **kw) or 0)


def _demo(argv: Sequence[str]) -> int:
    from .demo import run_demo
    return int(run_demo(list(argv), _Parser) or 0)


def _cmd_top(a) -> int:
    from . import top
    try:
        return top.main(a.url, a.interval, a.sort, a.once, a.json)
    except top.TopError as e:
        raise CLIError(f"top: {e}") from None


def _cmd_advise(a) -> int:
    advice = advise(_load_all(a.files), a.top)
    print(ADVICE.render(advice, "json" if a.json else "table", about=", ".join(a.files),
                        **({} if a.json else {"width": _terminal_width()})))
    return 0


# ------------------------------------------------------------------- parser
def _value(parse: Callable[[str, Any], Any]) -> Callable[[str], Any]:
    """An argparse type from one of config's parsers (argparse names the argument in its message)."""
    def convert(s: str) -> Any:
        try:
            return parse("", s)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).strip()) from None
    return convert


def _option(name: str) -> Callable[[str], Any]:
    """The argparse type of an argument that sets an option: the option's own parser."""
    return _value(config.BY_NAME[name].parse)


def _fraction(s: str) -> float:
    try:
        x = float(s)
    except ValueError:
        x = float("nan")
    if not 0 < x < 1:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1 (exclusive), such as 0.99, got {s!r}")
    return x


def _percent(s: str) -> float:
    try:
        x = float(s.rstrip("%"))
    except ValueError:
        x = float("nan")
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must be a percentage 0 or more, got {s!r}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="instrument", description="Per-stage instrumentation for ML inference services.")
    p.add_argument("--version", action="version", version=f"instrument {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    r = sub.add_parser("run", help="run a program with the SDK on; merge and report its processes' snapshots")
    r.add_argument("-o", "--output", default="run.json", help="merged snapshot (default run.json); each process "
                   "saves its part into <stem>.parts/ beside it, removed after the merge")
    r.add_argument("--keep-parts", action="store_true", help="keep each process's snapshot in <stem>.parts/")
    r.add_argument("--trace-events", type=_option("trace_events"), default=100_000, metavar="N",
                   help="timeline events kept per process for the Chrome trace (default 100000, 0 = off)")
    r.add_argument("--no-report", action="store_true", help="do not print the breakdown")
    r.add_argument("--exit-zero-on-term", action="store_true", help="exit 0, not 143, when the program was stopped "
                   "by SIGTERM (a service's normal stop: systemd, Kubernetes, docker stop)")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    r.set_defaults(func=_cmd_run)

    rp = sub.add_parser("report", help="print the breakdown of snapshot files (merged)")
    rp.add_argument("files", nargs="*", metavar="FILE", help="snapshot files, merged; a folder: the snapshots in it")
    rp.add_argument("--since", nargs=2, metavar=("EARLIER", "LATER"),
                    help="only what happened between two snapshots of one process")
    rp.add_argument("--tail", action="store_true",
                    help="which stages the slow calls of each top-level stage lost their time in")
    rp.add_argument("--quantile", type=_fraction, metavar="Q", help="with --tail: slow calls are those at or above "
                    "this quantile of the top-level stage (default 0.99)")
    rp.add_argument("--json", action="store_true", help="the same as --format json")
    rp.add_argument("--sort", choices=sort_keys(), metavar="KEY",
                    help=f"siblings in tree order, by name, or by a metric, largest first: {', '.join(sort_keys())}")
    rp.add_argument("--depth", type=_value(config.integer(1)), metavar="N")
    rp.add_argument("--fold", action="store_true", help="one row per stage name wherever it nested")
    rp.add_argument("--format", choices=list(formats()), default="table", metavar="FORMAT",
                    help=f"the breakdown in one of the export formats: {', '.join(formats())} (--tail, --ops and "
                    "--ranks: those their view comes in)")
    rp.add_argument("--ops", action="store_true", help="show the torch operators under each stage")
    rp.add_argument("--ranks", action="store_true", help="the ranks of a torch.distributed job side by side: each "
                    "stage's spread over ranks per step, the straggler, the wait it caused, missing ranks")
    rp.set_defaults(func=_cmd_report)

    d = sub.add_parser("diff", help="compare two snapshots stage by stage")
    d.add_argument("before", metavar="BEFORE")
    d.add_argument("after", metavar="AFTER")
    d.add_argument("--format", choices=DIFF.formats(), default="table", metavar="FORMAT",
                   help=f"{', '.join(DIFF.formats())} (default table)")
    d.add_argument("--basis", choices=BASES, help="what the tests compare: windows taken in turns, windows, or "
                   "runs (default: the strongest both snapshots allow; the output says which and why)")
    d.add_argument("--reference", metavar="STAGE", help="a stage whose code did not change, run in the same calls "
                   "as the others: its change of time is taken as the machine's, and every other stage's time is "
                   "judged relative to it (without one, one run a side judges CPU time against the change its "
                   "stages that hold no other share)")
    d.add_argument("--fail-on-regression", type=_percent, metavar="PCT",
                   help="exit 1 when any stage's CPU time, wall time (where the machine does not explain it), "
                   "instructions or page faults per call grew beyond noise and by more than PCT percent; exit 0 "
                   "where none did and each of them could have shown PCT; else inconclusive: exit "
                   f"{INCONCLUSIVE}, saying how many runs or calls would show PCT")
    d.add_argument("--on-inconclusive", choices=("pass", "fail"), help="with --fail-on-regression: exit 0 (pass) "
                   f"or 1 (fail) where the gate is inconclusive, in place of {INCONCLUSIVE}")
    d.add_argument("--summary", metavar="FILE", help="write the judgement as JSON: basis, machine line, and per "
                   "stage and figure its estimate, interval and `significant` (`-`: stdout)")
    d.add_argument("--alpha", type=_option("diff_alpha"), metavar="A",
                   help="chance of calling noise a change (default: the diff_alpha option, 0.01)")
    d.add_argument("--min-change", type=_percent, metavar="PCT",
                   help="smallest change in percent called beyond noise (default: the diff_min_change option, 3)")
    d.set_defaults(func=_cmd_diff)

    m = sub.add_parser("merge", help="merge snapshot files exactly")
    m.add_argument("files", nargs="+", metavar="FILE")
    m.add_argument("-o", "--output", default="-", help="merged snapshot (default: stdout)")
    m.add_argument("--by-rank", action="store_true", help="the files are the ranks of one torch.distributed job "
                   "(parts of `instrument run`, snapshot writer files or folders): checked, merged per rank")
    m.set_defaults(func=_cmd_merge)

    e = sub.add_parser("export", help="write snapshots in another format")
    g = e.add_mutually_exclusive_group(required=True)
    options: Dict[str, Tuple[Any, List[str]]] = {}
    for f in formats().values():
        g.add_argument(f"--{f.name}", metavar="OUT", dest=_format_dest(f.name),
                       help=f"{f.summary.rstrip('.')} (OUT: a {f.extension} file, or - for stdout)")
        for o in f.options:
            options.setdefault(o.name, (o, []))[1].append(f"--{f.name}")
    e.add_argument("files", nargs="+", metavar="SNAPSHOT")
    for o, owners in options.values():
        kind: Dict[str, Any] = {"action": "store_true"} if o.metavar is None else {"metavar": o.metavar}
        if o.parse is not None:
            kind["type"] = _value(lambda _, text, parse=o.parse: parse(text))
        e.add_argument(f"--{o.name}", dest=_option_dest(o.name), help=f"with {' or '.join(owners)}: {o.help}", **kind)
    e.set_defaults(func=_cmd_export)

    dr = sub.add_parser("doctor", help="what this machine allows (perf counters, NVTX, GPU)")
    dr.add_argument("--json", action="store_true")
    dr.set_defaults(func=_cmd_doctor)

    n = sub.add_parser("nsys", help="run a program under Nsight Systems, capturing the steady state")
    n.add_argument("--dry-run", action="store_true", help="print the nsys command only")
    n.add_argument("--capture", type=_option("capture"), metavar="NAME", help="NVTX capture range name")
    n.add_argument("--warmup", type=_option("warmup"), metavar="N", help="iterations before the capture range opens")
    n.add_argument("-o", "--output", metavar="OUT", help="nsys report file")
    n.add_argument("command", nargs=argparse.REMAINDER)
    n.set_defaults(func=_cmd_nsys)

    ad = sub.add_parser("advise", help="the biggest stages' bottleneck verdicts and what to run next")
    ad.add_argument("files", nargs="*", default=["run.json"], metavar="SNAPSHOT", help="default run.json")
    ad.add_argument("--top", type=_value(config.integer(1)), default=3, metavar="N")
    ad.add_argument("--json", action="store_true")
    ad.set_defaults(func=_cmd_advise)

    tp = sub.add_parser("top", help="live view of a running process's stages, from its /snapshot endpoint")
    tp.add_argument("url", metavar="URL", help=f"host:port (or port) of {config.env_name('serve')} / "
                    "instrument.serve_metrics, or a full http://host:port/path serving a snapshot")
    tp.add_argument("--interval", type=_value(config.number(0.05, 3600)), default=2.0, metavar="SECONDS",
                    help="window length and refresh period (default 2)")
    tp.add_argument("--sort", choices=sort_keys(), default="total", metavar="KEY",
                    help="siblings ordered by this, as `report --sort` (keys change it while running)")
    tp.add_argument("--once", action="store_true", help="print one window after --interval seconds and exit")
    tp.add_argument("--json", action="store_true", help="the window as snapshot JSON (implies --once)")
    tp.set_defaults(func=_cmd_top)

    x = sub.add_parser("demo", help="run the demo inference service", add_help=False)
    x.add_argument("args", nargs=argparse.REMAINDER)
    x.set_defaults(func=lambda a: _demo(_rest(a.args)))
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
        config.unset_in_env("output")   # the command itself is not measured; run sets it for the program
        from . import configure
        configure(output=None, serve=None)   # the command is not measured, nor served
    argv = list(argv)
    try:
        try:   # every command reads the environment strictly (docs/configuration.md): a bad value is exit 2
            config.from_env(strict=True)
        except ValueError as e:
            raise CLIError(f"{argv[0] + ': ' if argv and not argv[0].startswith('-') else ''}{e}") from None
        if argv[:1] == ["demo"]:   # the demo parses its own options
            return _demo(argv[1:])
        args = build_parser().parse_args(argv)
        if getattr(args, "func", None) is None:
            build_parser().print_help(sys.stderr)
            return 2
        return args.func(args)
    except (CLIError, SnapshotError) as e:
        _err(str(e))
        return 2
    except SystemExit as e:   # --help and --version
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")   # the reader went away (| head): no error at exit
        except OSError:
            pass
        return 0
    except Exception as e:
        if config.debug():
            raise
        _err(f"internal error: {type(e).__name__}: {e} ({config.DEBUG_VARIABLE}=1 shows the traceback)")
        return 2


if __name__ == "__main__":
    sys.exit(main())
