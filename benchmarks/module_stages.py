"""Cost of instrument.modules per module call, against a bare pair of forward hooks, and its share of a
MiniLM forward.

    PYTHONPATH=. python benchmarks/module_stages.py [--rounds 11] [--chunks 20] [--number 1000] [--forwards 20]

Per module call: a module whose forward returns its input, in three forms (bare; a no-op forward
pre-hook and forward hook; instrument.modules).  Each round times `chunks` chunks of `number` calls per
form, the forms taking turns chunk by chunk, and keeps each form's fastest chunk (load on a shared machine
only ever adds time); a form's cost is that time per call less the bare call's in the same round, and the
ratio is instrument's cost over the hooks' cost (target <= 1.3), the median over the rounds.
Share of a forward: all-MiniLM-L6-v2 (the demo's model, 8 sentences of 16 tokens) under instrument.modules
at depth 2 and at every depth: the per-call cost above times the module calls in one forward, over the bare
forward's time; beside it the measured difference, bare and instrumented forwards taking turns one by one,
each round's fastest of each, the median over the rounds.  One thread for torch; the load average is printed.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def per_call(rounds, chunks, number):
    import torch

    import instrument

    class Same(torch.nn.Module):
        def forward(self, x):
            return x

    bare, hooked, staged = Same(), Same(), Same()
    hooked.register_forward_pre_hook(lambda module, args: None)
    hooked.register_forward_hook(lambda module, args, output: None)
    instrument.modules(staged, name="same")
    x = torch.zeros(1)
    forms = {"bare": bare, "forward hooks": hooked, "instrument.modules": staged}
    samples = {k: [] for k in forms}
    for _ in range(rounds):
        best = dict.fromkeys(forms, float("inf"))
        for _ in range(chunks):
            for name, module in forms.items():
                t0 = time.perf_counter_ns()
                for _ in range(number):
                    module(x)
                best[name] = min(best[name], (time.perf_counter_ns() - t0) / number)
        for name in forms:
            samples[name].append(best[name])
    cost = {k: [s - b for s, b in zip(v, samples["bare"])] for k, v in samples.items() if k != "bare"}
    ratios = [s / h for s, h in zip(cost["instrument.modules"], cost["forward hooks"])]
    return {"bare_ns": statistics.median(samples["bare"]),
            "hooks_ns": statistics.median(cost["forward hooks"]),
            "stage_ns": statistics.median(cost["instrument.modules"]),
            "ratio": statistics.median(ratios), "ratio_range": (min(ratios), max(ratios)),
            "calls": instrument.snapshot()["same"].calls}


def forward_share(rounds, forwards, stage_ns):
    import torch

    import instrument
    from instrument.demo import batches, load_sentences
    from instrument.demo.service import load_model, model_dir
    from transformers import AutoTokenizer

    model = load_model("cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)
    texts = next(batches(load_sentences(), 1, 8))
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    out = {}
    for depth in (2, None):
        handle = instrument.modules(model, depth=depth)
        instrument.reset()
        with torch.inference_mode():
            model(**enc)
        calls = sum(s.calls for s in instrument.snapshot())   # module calls in one forward
        handle.remove()
        times = {"bare": [], "modules": []}
        with torch.inference_mode():
            for _ in range(rounds):
                best = {"bare": float("inf"), "modules": float("inf")}
                for _ in range(forwards):
                    for form in best:
                        h = instrument.modules(model, depth=depth) if form == "modules" else None
                        t0 = time.perf_counter_ns()
                        model(**enc)
                        best[form] = min(best[form], time.perf_counter_ns() - t0)
                        if h is not None:
                            h.remove()
                for form in best:
                    times[form].append(best[form])
        bare = statistics.median(times["bare"])
        out["all" if depth is None else f"depth {depth}"] = {
            "module_calls": calls, "forward_ms": bare / 1e6, "share": calls * stage_ns / bare,
            "measured": statistics.median([m / b - 1 for m, b in zip(times["modules"], times["bare"])])}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--number", type=int, default=1000)
    p.add_argument("--forwards", type=int, default=20)
    args = p.parse_args(argv)
    if args.rounds < 11:
        p.error("--rounds must be at least 11 (a median of fewer says little here)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    torch.set_num_threads(1)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}, "
          f"{args.rounds} rounds")
    r = per_call(args.rounds, args.chunks, args.number)
    print(f"per module call (median of {args.rounds} rounds, each the fastest of {args.chunks} chunks of "
          f"{args.number:,} calls; cost over a bare call of {r['bare_ns']:.0f} ns):")
    print(f"  bare pair of forward hooks   {r['hooks_ns']:8.0f} ns")
    print(f"  instrument.modules           {r['stage_ns']:8.0f} ns   ratio {r['ratio']:.2f} "
          f"(rounds {r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}; target <= 1.3)")
    try:
        shares = forward_share(args.rounds, args.forwards, r["stage_ns"])
    except Exception as e:   # the model package is optional
        print(f"MiniLM share: not measured ({e})")
        shares = {}
    for name, s in shares.items():
        print(f"MiniLM forward, modules {name}: {s['module_calls']} module calls per forward of "
              f"{s['forward_ms']:.2f} ms: {100 * s['share']:.2f} % from the per-call cost "
              f"(measured {100 * s['measured']:+.2f} %)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
