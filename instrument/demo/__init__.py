"""``instrument demo``: a real BERT embedding service measured before and after optimisation.

The heavy packages (torch, transformers, tokenizers, the model) are imported only when the
demo runs, so ``import instrument`` stays light.
"""
import argparse
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


def tree_order(paths):
    """Paths depth-first, parents before children, siblings in the order first seen."""
    rank = {p: i for i, p in reversed(list(enumerate(paths)))}
    return sorted(paths, key=lambda p: [rank.get(p[:k + 1], len(rank)) for k in range(len(p))])


def render_breakdown(snap) -> str:
    """The per-stage table: the SDK's table exporter where it exists, a plain one until then."""
    try:
        from instrument.exporters.table import render
    except ImportError:
        render = None
    if render is not None:
        return render(snap)
    lines = [f"{'stage':<28}{'calls':>7}{'total ms':>11}{'mean ms':>10}{'p50 ms':>9}{'p99 ms':>9}"]
    by_path = {tuple(s.path): s for s in snap.stages}
    for path in tree_order(list(by_path)):
        s, w = by_path[path], by_path[path].wall_ns
        name = "  " * (len(path) - 1) + path[-1]
        lines.append(f"{name:<28}{s.calls:>7}{w['total'] / 1e6:>11.1f}{w['mean'] / 1e6:>10.2f}"
                     f"{w['p50'] / 1e6:>9.2f}{w['p99'] / 1e6:>9.2f}")
    return "\n".join(lines)


def _mean_ms(snap, path):
    for s in snap.stages:
        if tuple(s.path) == tuple(path):
            return s.wall_ns["mean"] / 1e6
    return None


def _change(before, after, digits):
    pct = (after - before) / before * 100 if before else 0.0
    return f"{before:.{digits}f} ms → {after:.{digits}f} ms ({'−' if pct < 0 else '+'}{abs(pct):.0f}%)"


def headline(before, after) -> str:
    """End-to-end change of the mean ``request`` latency, e.g. 'request: 25.0 ms → 18.1 ms (−28%)'."""
    return "request: " + _change(_mean_ms(before, ("request",)), _mean_ms(after, ("request",)), 1)


def render_diff(before, after) -> str:
    """Headline, then every stage's mean before → after (until the SDK has its own diff)."""
    lines = [headline(before, after)]
    paths = tree_order(list(dict.fromkeys(tuple(s.path) for s in list(before.stages) + list(after.stages))))
    for path in paths:
        b, a = _mean_ms(before, path), _mean_ms(after, path)
        name = "/".join(path)
        if b is None or a is None:
            lines.append(f"  {name:<26} only {'after' if b is None else 'before'}")
        else:
            lines.append(f"  {name:<26} {_change(b, a, 2)}")
    return "\n".join(lines)


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


def _measure(service, sentences, args, progress):
    for texts in batches(sentences, WARMUP_REQUESTS, args.batch_size):
        service.embed(texts)
    instrument.reset()  # between the variants, and so the warm-up requests are not counted
    for texts in batches(sentences, args.requests, args.batch_size):
        service.embed(texts)
        progress.update(1)
    return instrument.snapshot()


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
    snapshots, written = {}, []
    with tqdm(total=args.requests * len(variants), unit="req", desc="instrument demo") as progress:
        for variant in variants:
            progress.set_postfix_str(variant)
            snapshots[variant] = _measure(EmbeddingService(variant, device, model=model), sentences, args, progress)
            path = out / f"{variant}.json"
            snapshots[variant].save(str(path))
            written.append(path)

    for variant, snap in snapshots.items():
        print(f"\n== {variant}: {args.requests} requests of {args.batch_size} sentences on {device} ==")
        print(render_breakdown(snap))
    if len(snapshots) == 2:
        print("\n== baseline → optimized ==")
        print(render_diff(snapshots["baseline"], snapshots["optimized"]))
    print()
    for path in written:
        print(f"wrote {path}")
    return 0
