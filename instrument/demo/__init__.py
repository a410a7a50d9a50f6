"""``instrument demo``: a real BERT embedding service measured before and after optimisation.

The heavy packages (torch, transformers, tokenizers, the model) are imported only when the
demo runs, so ``import instrument`` stays light.
"""
import argparse
import os
import sys
from pathlib import Path

import instrument

DEFAULT_REQUESTS = 150  # both variants, model load included, take about 25 s on 2 idle CPU cores
WARMUP_REQUESTS = 2
SENTENCES_PATH = Path(__file__).with_name("sentences.txt")


def load_sentences(path=SENTENCES_PATH):
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def batches(sentences, count, size):
    """``count`` batches of ``size`` sentences, cycling through the list."""
    for i in range(count):
        yield [sentences[(i * size + k) % len(sentences)] for k in range(size)]


def render_breakdown(snap) -> str:
    from instrument.exporters.table import render
    return render(snap)


def render_diff(before, after) -> str:
    """The SDK's diff: the headline (end-to-end request latency before → after), then every stage."""
    from instrument.exporters.table import render_diff
    return render_diff(instrument.diff(before, after))


def headline(before, after) -> str:
    from instrument.exporters.table import headline
    return headline(instrument.diff(before, after))


def status_lines(snap) -> list:
    """What `instrument doctor` would say, one line each: counters, NVTX, torch."""
    ev = (snap.meta.get("counters") or {}).get("events") or {}
    ok = [n for n, e in ev.items() if e.get("available")]
    bad = {n: e for n, e in ev.items() if not e.get("available")}
    line = f"perf counters: {', '.join(ok) or 'none'} counted"
    if bad:
        first = next(iter(bad.values()))
        line += f"; unavailable: {', '.join(bad)} ({first.get('reason')}{'; fix: ' + first['fix'] if first.get('fix') else ''})"
    cfg = snap.meta.get("config") or {}
    emitter = (snap.meta.get("nvtx") or {}).get("emitter")
    tool = "a tool is attached" if os.environ.get("NVTX_INJECTION64_PATH") else \
        "no tool attached (run under `instrument nsys -- ...` to record them)"
    nv = f"NVTX: ranges in domain '{cfg.get('nvtx_domain')}' via {emitter}, {tool}" if cfg.get("nvtx") \
        else "NVTX: off"
    return [line, nv]


def _parser():
    p = argparse.ArgumentParser(prog="instrument demo", description=(
        "Serve all-MiniLM-L6-v2 on a stream of batched requests, baseline vs optimized, "
        "and print the per-stage breakdowns and their diff."))
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="batches per variant (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="sentences per request (default %(default)s)")
    p.add_argument("--variant", choices=("baseline", "optimized", "both"), default="both")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", default="instrument-demo", help="folder for the snapshots (default ./%(default)s)")
    return p


CHUNK = 10   # requests per turn: the variants take turns, so machine noise falls on both alike


def _measure(services, sentences, args, progress):
    """Alternate the variants chunk by chunk, the first of each turn alternating too;
    each chunk's snapshot is taken and the collector reset, and a variant's chunks are
    merged (exactly) at the end: each chunk stays a window, so the diff pairs the
    variants' chunks of one turn and tests each change against the spread of the pairs."""
    for service in services.values():
        for texts in batches(sentences, WARMUP_REQUESTS, args.batch_size):
            service.embed(texts)
    instrument.reset()   # the warm-up requests are not counted
    parts = {v: [] for v in services}
    stream = list(batches(sentences, args.requests, args.batch_size))
    for turn, start in enumerate(range(0, len(stream), CHUNK)):
        order = list(services.items())
        for variant, service in order if turn % 2 == 0 else order[::-1]:   # neither variant always goes first
            progress.set_postfix_str(variant)
            for texts in stream[start:start + CHUNK]:
                service.embed(texts)
                progress.update(1)
            parts[variant].append(instrument.snapshot())
            instrument.reset()
    return {v: p[0].merge(*p[1:]) for v, p in parts.items()}


def run_demo(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.requests < 1 or args.batch_size < 1:
        print("instrument demo: --requests and --batch-size must be at least 1", file=sys.stderr)
        return 2
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

    variants = ["baseline", "optimized"] if args.variant == "both" else [args.variant]
    sentences = load_sentences()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tqdm(total=args.requests * len(variants), unit="req", desc="instrument demo") as progress:
        services = {v: EmbeddingService(v, device, model=model) for v in variants}
        snapshots = _measure(services, sentences, args, progress)
    from instrument.analysis.advice import advise
    from instrument.analysis.verdict import with_verdicts
    from instrument.exporters import html
    from instrument.exporters.table import render_advice
    for variant, snap in snapshots.items():
        snapshots[variant] = snap = with_verdicts(snap)
        written.append(Path(snap.save(str(out / f"{variant}.json"))))
        print(f"\n== {variant}: {args.requests} requests of {args.batch_size} sentences on {device} ==")
        print(render_breakdown(snap))
    if len(snapshots) == 2:
        print("\n== baseline → optimized ==")
        print(render_diff(snapshots["baseline"], snapshots["optimized"]))
        report = html.render(snapshots["optimized"], before=snapshots["baseline"], title="instrument demo: baseline → optimized")
    else:
        report = html.render(next(iter(snapshots.values())), title=f"instrument demo: {variants[0]}")
    page = out / "report.html"
    page.write_text(report, encoding="utf-8")
    written.append(page)
    print()
    judged = variants[-1]   # after a diff, the advice is about what is left to do: the last variant
    print(render_advice(advise(snapshots[judged]), about=f"{judged} ({out / (judged + '.json')})"))
    print()
    for line in status_lines(snapshots[variants[0]]):
        print(line)
    for path in written:
        print(f"wrote {path}")
    return 0
