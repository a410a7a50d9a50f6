"""``instrument demo``: a real BERT embedding service, where its time goes, the fix, and the proof.

It serves all-MiniLM-L6-v2 in two variants taking turns (``baseline``: a first version with
the mistakes real services make; ``optimized``: those fixed) and walks the three-step
workflow on its own run: (1) the per-stage breakdown with counters, items and verdicts,
(2) the NVTX ranges and the ``instrument nsys`` command that records them, (3)
``instrument.profile()`` on a few requests, showing the operators under the stage the
advice names, and ``instrument.modules`` splitting the forward stage by the model's modules.  Every figure and sentence it prints is computed from the measured
snapshots; ``summary.json`` holds the same as data.

It is time-boxed: the variants take turns until the SDK's own diff of the turns so far is
decided (the request and every stage the fix targets faster beyond noise), until
``--requests``, or until ``--time-limit`` leaves just the time the steps after need; it says
which stopped it.

The heavy packages (torch, transformers, tokenizers, the model) are imported only when the
demo runs, so ``import instrument`` stays light.
"""
import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import instrument

DEFAULT_REQUESTS = 200  # a cap: the diff is decided, or the time limit reached, well before it
DEFAULT_TIME_LIMIT = 80.0   # seconds for the whole demo, model load included (checked between turns)
WARMUP_REQUESTS = 2
PROFILED_REQUESTS = 3
SENTENCES_PATH = Path(__file__).with_name("sentences.txt")
CHUNK = 4        # requests per turn: the variants take turns, so machine noise falls on both alike
MIN_TURNS = 8    # turns before the diff is checked: the diff's turns basis needs 8 pairs (significance.MIN_TURNS)
OMP_WAIT_POLICY = "PASSIVE"   # the demo's default where the environment sets none (run_demo says why)


def load_sentences(path=SENTENCES_PATH):
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def batches(sentences, count, size):
    """``count`` batches of ``size`` sentences, cycling through the list."""
    for i in range(count):
        yield [sentences[(i * size + k) % len(sentences)] for k in range(size)]


def _width():
    return max(80, shutil.get_terminal_size((100, 24)).columns)


def render_breakdown(snap, width=None) -> str:
    from instrument.exporters.table import render
    return render([snap], width=width or _width())


def render_diff(d, width=None) -> str:
    """The SDK's diff `d`: the headline (end-to-end request latency before → after), then every stage."""
    from instrument.exporters.table import diff
    return diff(d, width=width or _width())


def status_lines(snap) -> list:
    """What `instrument doctor` would say, one line each: counters, NVTX."""
    ev = (snap.meta.get("counters") or {}).get("events") or {}
    ok = [n for n, e in ev.items() if e.get("available")]
    bad = {n: e for n, e in ev.items() if not e.get("available")}
    line = f"perf counters: {', '.join(ok) or 'none'} counted"
    if bad:
        first = next(iter(bad.values()))
        line += f"; unavailable: {', '.join(bad)} ({first.get('reason')}{'; fix: ' + first['fix'] if first.get('fix') else ''})"
    cfg = snap.meta.get("config") or {}
    emitter = (snap.meta.get("nvtx") or {}).get("emitter")
    tool = "a tool is attached" if os.environ.get("NVTX_INJECTION64_PATH") else "no tool attached"
    nv = (f"NVTX: every stage above is a range in domain '{cfg.get('nvtx_domain')}' (via {emitter}), {tool}"
          if cfg.get("nvtx") else "NVTX: off")
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    omp = f"OpenMP: OMP_WAIT_POLICY={policy}" + (
        " (the demo's default: torch's threads sleep between operators rather than spin, which beside other work "
        "takes the cores they need)" if policy == OMP_WAIT_POLICY else "")
    return [line, nv, omp]


# ------------------------------------------------------------------ the figures
def _item(s, name):
    return ((s.items or {}).get(name) or {}).get("total") if s is not None else None


def _self_per_call(s):
    return s.wall_self / s.calls if s is not None and s.calls else None


def _change(before, after):
    return after / before - 1 if before and after is not None else None


def _memory_change(base, opt):
    """The stage under request whose memory peak per call the fix shrank most (CUDA's allocated bytes where the
    demo ran on a GPU, else the resident set's): {"path", "source", "baseline", "optimized"} in bytes; None where no
    stage's peak fell."""
    best = None
    for s in base:
        o = opt.get(s.path)
        if len(s.path) < 2 or o is None:
            continue
        for src in ("cuda:0", "host"):
            b, a = s.memory_of(src), o.memory_of(src)
            if b and a and b["peak_mean"] is not None and a["peak_mean"] is not None:
                drop = b["peak_mean"] - a["peak_mean"]
                if drop > 0 and (best is None or drop > best[0]):
                    best = (drop, {"path": list(s.path), "source": src, "baseline": b["peak_mean"],
                                   "optimized": a["peak_mean"]})
                break
    return best[1] if best else None


def summarize(snapshots, advice, files, device, args, stopped, d=None) -> dict:
    """The demo's findings as data, every figure read from the snapshots: the first
    variant measured, and the optimized one when both ran; `stopped`: what ended the turns;
    `d`: the diff of the variants."""
    base = next(iter(snapshots.values()))
    opt = snapshots.get("optimized") if len(snapshots) == 2 else None
    req_b = base["request"]
    out = {"device": device, "torch": base.meta.get("torch"), "requests": req_b.calls, "batch_size": args.batch_size,
           "stopped": stopped,
           "request": {"baseline": {"p50_ns": req_b.quantile(0.5), "p99_ns": req_b.quantile(0.99),
                                    "mean_ns": req_b.wall_mean}},
           "files": [str(f) for f in files]}
    top = advice[0] if advice else None
    if top is not None:
        s = base[top["path"]]
        finding = {"path": top["path"], "verdict": top["verdict"], "reason": top["reason"],
                   "share_of_request": s.wall_total / req_b.wall_total if req_b.wall_total else None,
                   "self_per_call_ns": _self_per_call(s)}
        fed, pad = _item(s, "tokens"), _item(s, "padding_tokens")
        if fed:
            finding.update(tokens_per_call=fed / s.calls, padding_share=(pad or 0) / fed,
                           ns_per_token=s.wall_total / fed)
        out["finding"] = finding
    if opt is not None:
        req_o = opt["request"]
        out["request"]["optimized"] = {"p50_ns": req_o.quantile(0.5), "p99_ns": req_o.quantile(0.99),
                                       "mean_ns": req_o.wall_mean}
        out["request"]["p50_change"] = _change(req_b.quantile(0.5), req_o.quantile(0.5))
        out["request"]["p99_change"] = _change(req_b.quantile(0.99), req_o.quantile(0.99))
        rows = []
        for s in base:
            if len(s.path) < 2 or not s.calls:
                continue
            b, o = _self_per_call(s), _self_per_call(opt.get(s.path))
            rows.append({"path": list(s.path), "self_per_call_ns": {"baseline": b, "optimized": o},
                         "change_ns": None if o is None else o - b, "change": _change(b, o)})
        rows.sort(key=lambda r: r["change_ns"] if r["change_ns"] is not None else 0)
        out["stages"] = rows
        out["shrank_most"] = rows[0]["path"] if rows else None
        out["memory"] = _memory_change(base, opt)
    if d is not None:
        from instrument.exporters.format import headline
        out["diff"] = {"headline": headline(d), "significant": d.significant, "decided": stopped["decided"],
                       "basis": d.basis}
    return out


def _ms(ns):
    return "n/a" if ns is None else f"{ns / 1e6:.1f} ms" if ns >= 1e6 else f"{ns / 1e3:.0f} µs"


def _pct(x):
    return "n/a" if x is None else f"{x * 100:+.1f}%".replace("-", "\u2212")


def stop_text(stopped) -> str:
    """Why the turns ended, and whether the diff is decided: 'stopped when the diff was decided, after 8 turns
    (21 s)'."""
    turns = f"{stopped['turns']} turn{'s' if stopped['turns'] != 1 else ''} ({stopped['seconds']:.0f} s)"
    if stopped["why"] == "decided":
        return f"stopped when the diff was decided, after {turns}"
    where = f"at the time limit of {stopped['time_limit']:g} s" if stopped["why"] == "time limit" else "at --requests"
    state = {True: "; the diff is decided", None: ""}.get(stopped.get("decided"),
                                                          f"; not decided: {', '.join(stopped.get('undecided', []))}")
    return f"stopped {where}, after {turns}{state}"


def _memory_text(m) -> str:
    if not m:
        return ""
    what = "the resident set's" if m["source"] == "host" else f"{m['source']}'s allocated"
    return (f"; memory: {'/'.join(m['path'][1:])}'s peak per call ({what}) {m['baseline'] / 2 ** 20:.1f} → "
            f"{m['optimized'] / 2 ** 20:.1f} MiB")


def summary_lines(summary, variants) -> list:
    """At most five lines for a ticket: the diff's headline and what stopped it, the top finding with its evidence,
    the fix, the win, the files."""
    r = summary["request"]
    lines = []
    f = summary.get("finding")
    size = f"{summary['requests']} requests of {summary['batch_size']} sentences"
    if "optimized" in r:
        lines.append(f"{summary['diff']['headline']}; {stop_text(summary['stopped'])}")
    else:
        lines.append(f"request p50 {_ms(r['baseline']['p50_ns'])}, p99 {_ms(r['baseline']['p99_ns'])}: "
                     f"{size} on {summary['device']}; {stop_text(summary['stopped'])}")
    if f is not None:
        text = (f"finding: {'/'.join(f['path'])} is {f['share_of_request'] * 100:.0f}% of the request, "
                f"{f['verdict']} ({f['reason'].split(';')[0]})")
        if f.get("tokens_per_call"):
            text += (f"; {f['padding_share'] * 100:.0f}% of the {f['tokens_per_call']:.0f} tokens per call it runs "
                     "are padding")
        lines.append(text)
    if summary.get("stages"):
        shrunk = [s for s in summary["stages"] if s["change"] is not None and s["change"] < -0.2][:3]
        if shrunk:
            from .service import OptimizedInputs
            lines.append("fix: " + OptimizedInputs.description + " — " + ", ".join(
                f"{'/'.join(s['path'][1:])} {_ms(s['self_per_call_ns']['baseline'])} → "
                f"{_ms(s['self_per_call_ns']['optimized'])}" for s in shrunk) + " per call")
        lines.append(f"win: request p50 {_ms(r['baseline']['p50_ns'])} → {_ms(r['optimized']['p50_ns'])} "
                     f"({_pct(r['p50_change'])}), p99 {_pct(r['p99_change'])}, mean "
                     f"{_pct(_change(r['baseline']['mean_ns'], r['optimized']['mean_ns']))}: {size} per variant on "
                     f"{summary['device']}; the advice's first stage "
                     f"{'is' if summary.get('shrank_most') == (f or {}).get('path') else 'is not'} the one that "
                     "shrank most" + _memory_text(summary.get("memory")))
    lines.append("files: " + ", ".join(summary["files"]))
    return lines[:5]


# ----------------------------------------------------------------- the run
def _parser(parser_class=argparse.ArgumentParser):
    p = parser_class(prog="instrument demo", description=(
        "Serve all-MiniLM-L6-v2 on a stream of batched requests, baseline vs optimized, find where the "
        "time goes with the SDK, and prove the fix."))
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS,
                   help="most batches per variant (default %(default)s); the demo stops sooner when its diff is "
                        "decided or at --time-limit")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, metavar="SECONDS",
                   help="seconds for the whole demo (default %(default)g): the variants take turns until the time "
                        "left is what the steps after them need, then it prints what it has")
    p.add_argument("--batch-size", type=int, default=8, help="sentences per request (default %(default)s)")
    p.add_argument("--variant", choices=("baseline", "optimized", "both"), default="both")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when torch sees a CUDA device, else cpu")
    p.add_argument("--out", default="instrument-demo", help="folder for the snapshots (default ./%(default)s)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (it is always in summary.json)")
    return p


TIME = ("cpu", "wall")   # the figures the fix claims: a page fault more or less does not undo a faster request


def undecided(d) -> list:
    """What keeps a diff of the demo's turns from being decided: 'request/tokenize within noise' for each of the
    request and the stages the fix targets whose time the diff's own tests do not judge faster beyond noise."""
    from .service import OptimizedInputs
    out = []
    for path in [("request",)] + [("request", name) for name in OptimizedInputs.targets]:
        r = d.row(path)
        word = r.judgement_of(TIME) if r is not None else "not measured"
        if word != "faster":
            out.append(f"{'/'.join(path)} {word}")
    return out


def decided(d) -> bool:
    """Whether a diff of the demo's turns is decided: the time of the request and of every stage the fix targets
    faster beyond noise."""
    return not undecided(d)


def _measure(services, sentences, args, progress, deadline, reserve):
    """Alternate the variants chunk by chunk, the first of each turn alternating too;
    each chunk's snapshot is taken and the collector reset, and a variant's chunks are
    merged (exactly): each chunk stays a window, so the diff pairs the variants' chunks of
    one turn and tests each change against the spread of the pairs.  After each turn from
    MIN_TURNS on, the diff of the merged chunks is checked; the turns stop when it is
    decided, at `args.requests`, or when the time left before `deadline` is less than
    another turn as long as the last and what `reserve(merged)` says the steps after need.
    Returns (merged, why it stopped, turns)."""
    for service in services.values():
        for texts in batches(sentences, WARMUP_REQUESTS, args.batch_size):
            service.embed(texts)
    instrument.reset()   # the warm-up requests are not counted
    parts = {v: [] for v in services}
    stream = list(batches(sentences, args.requests, args.batch_size))
    order = list(services.items())
    for turn, start in enumerate(range(0, len(stream), CHUNK), 1):
        began = time.monotonic()
        for variant, service in order if turn % 2 else order[::-1]:   # neither variant always goes first
            progress.set_postfix_str(f"turn {turn}, {variant}")
            for texts in stream[start:start + CHUNK]:
                service.embed(texts)
                progress.update(1)
            parts[variant].append(instrument.snapshot())
            instrument.reset()
        merged = {v: p[0].merge(*p[1:]) for v, p in parts.items()}
        if len(merged) == 2 and turn >= MIN_TURNS and decided(instrument.diff(merged["baseline"],
                                                                             merged["optimized"])):
            return merged, "decided", turn
        now = time.monotonic()
        if now + (now - began) + reserve(merged) >= deadline:
            return merged, "time limit", turn
    return merged, "requests", turn


def _reserve(merged) -> float:
    """Seconds the steps after the turns need: the profiled and module requests at a measured request's mean
    (twice, for the profiler and the hooks), and the verdicts, files and diff at a second a variant."""
    mean = max(s["request"].wall_mean for s in merged.values()) / 1e9
    return 2 * 2 * PROFILED_REQUESTS * mean + len(merged)


def _profile(service, sentences, args, path):
    """Step 3: instrument.profile() on a few requests; the top operators under `path`."""
    instrument.reset()
    with instrument.profile():
        for texts in batches(sentences, PROFILED_REQUESTS, args.batch_size):
            service.embed(texts)
    snap = instrument.snapshot()
    instrument.reset()
    s = snap.get(path)
    rows = ((s.ops or {}).get("by_self_cpu") or []) if s is not None else []
    total = sum(r.get("self_cpu_ns") or 0 for r in rows) or 1
    return [{"name": r["name"], "calls": r["calls"], "self_cpu_ns": r["self_cpu_ns"],
             "share": (r.get("self_cpu_ns") or 0) / total} for r in rows[:5]]


def _modules(service, sentences, args):
    """Step 3, by module: instrument.modules on a few requests splits forward by the model's own modules."""
    instrument.reset()
    with instrument.modules(service.model, depth=1):
        for texts in batches(sentences, PROFILED_REQUESTS, args.batch_size):
            service.embed(texts)
    snap = instrument.snapshot()
    instrument.reset()
    forward = snap.get(("request", "forward"))
    root = ("request", "forward", type(service.model).__name__)
    return [{"name": s.name, "calls": s.calls, "wall_ns": s.wall_total,
             "share": s.wall_total / forward.wall_total if forward is not None and forward.wall_total else None}
            for s in snap if s.path[:-1] == root]


def run_demo(argv=None, parser_class=argparse.ArgumentParser) -> int:
    """The demo; parser_class reads its options (the command line's gives one-line errors)."""
    started = time.monotonic()
    args = _parser(parser_class).parse_args(argv)
    if args.requests < 1 or args.batch_size < 1:
        print("instrument demo: --requests and --batch-size must be at least 1", file=sys.stderr)
        return 2
    if not args.time_limit > 0:
        print("instrument demo: --time-limit must be a number of seconds above 0", file=sys.stderr)
        return 2
    # torch's OpenMP threads spin between operators by default: beside other work the spinning takes the cores
    # the other thread needs (each request 2.5-14x slower at load 7 on 2 cores); waiting threads sleep instead.
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)
    from .service import DemoUnavailable, EmbeddingService, load_model, model_dir, resolve_device
    try:
        model_dir()
        try:
            from tqdm import tqdm
        except ImportError as exc:
            raise DemoUnavailable() from exc
        device = resolve_device(args.device)
        model = load_model(device)
    except (DemoUnavailable, ValueError) as exc:
        print(f"instrument demo: {exc}", file=sys.stderr)
        return 2
    if device == "cuda":
        instrument.configure(gpu=True)   # GPU time per stage from CUDA events

    variants = ["baseline", "optimized"] if args.variant == "both" else [args.variant]
    sentences = load_sentences()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    with tqdm(total=args.requests * len(variants), unit="req", desc="instrument demo", file=sys.stderr) as progress:
        services = {v: EmbeddingService(v, device, model=model) for v in variants}
        snapshots, why, turns = _measure(services, sentences, args, progress, started + args.time_limit, _reserve)
    stopped = {"why": why, "turns": turns, "seconds": time.monotonic() - started, "time_limit": args.time_limit,
               "decided": None}
    from instrument.analysis.advice import advise
    from instrument.analysis.verdict import with_verdicts
    from instrument.exporters import html
    from instrument.exporters.table import advice as render_advice
    written = []
    for variant, snap in snapshots.items():
        snapshots[variant] = with_verdicts(snap)
        written.append(Path(snapshots[variant].save(str(out / f"{variant}.json"))))
    first = snapshots[variants[0]]
    advice = advise(first)
    d = instrument.diff(snapshots["baseline"], snapshots["optimized"]) if len(snapshots) == 2 else None
    if d is not None:
        stopped["undecided"] = undecided(d)
        stopped["decided"] = not stopped["undecided"]

    say(f"\n== step 1: where the time goes — {variants[0]}, {first['request'].calls} requests of {args.batch_size} "
        f"sentences on {device}, {stop_text(stopped)} ==")
    say(render_breakdown(first))   # items show under their stage: cost per token, tokens/s
    for line in status_lines(first):
        say(line)
    say()
    say(render_advice(advice, about=f"{variants[0]} ({out / (variants[0] + '.json')})"))

    say("\n== step 2: the timeline ==")
    cmd = "instrument nsys --capture request -- python -m instrument demo --variant baseline --requests 20"
    if shutil.which("nsys"):
        say(f"nsys is installed: `{cmd}` records the NVTX ranges of every stage in a steady-state window")
    else:
        say(f"nsys is not installed here; on a machine with Nsight Systems, `{cmd}` records these stages' NVTX "
            "ranges next to the CUDA kernels")

    ops = []
    if advice:
        target = tuple(advice[0]["path"])
        ops = _profile(services[variants[0]], sentences, args, target)
        say(f"\n== step 3: operators under {'/'.join(target)} (instrument.profile() on {PROFILED_REQUESTS} requests) ==")
        for r in ops:
            say(f"  {r['name']:<40} {r['calls']:>6} calls {r['self_cpu_ns'] / 1e6:>9.2f} ms self CPU "
                f"{r['share'] * 100:5.1f}%")
        if not ops:
            say("  (no torch operators ran under it)")
    modules = _modules(services[variants[0]], sentences, args)
    if modules:
        say(f"\n  request/forward by module (instrument.modules(model, depth=1) on {PROFILED_REQUESTS} requests):")
        for r in modules:
            say(f"  {r['name']:<40} {r['calls']:>6} calls {r['wall_ns'] / 1e6:>9.2f} ms wall "
                f"{(r['share'] or 0) * 100:5.1f}% of forward")

    if len(snapshots) == 2:
        say(f"\n== baseline → optimized: {turns} turn{'s' if turns != 1 else ''} of {CHUNK} requests a side; "
            f"{stop_text(stopped)} ==")
        say(render_diff(d))
        say()   # after the diff, the advice is about what is left to do: the optimized variant
        say(render_advice(advise(snapshots["optimized"]), about=f"optimized ({out / 'optimized.json'})"))
        report = html.render([snapshots["baseline"], snapshots["optimized"]], diff=True,
                             title="instrument demo: baseline → optimized")
    else:
        report = html.render([first], title=f"instrument demo: {variants[0]}")
    page = out / "report.html"
    page.write_text(report, encoding="utf-8")
    written.append(page)
    summary = summarize(snapshots, advice, written + [out / "summary.json"], device, args, stopped, d)
    summary["operators"] = ops
    summary["modules"] = modules
    summary["advice"] = advice
    summary["lines"] = summary_lines(summary, variants)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False), encoding="utf-8")
    if args.json:
        print(json.dumps(summary, indent=2, allow_nan=False))
    else:
        print("\n== summary ==")
        for line in summary["lines"]:
            print(line)
    return 0
