"""Median ms per demo stage, baseline vs optimized, timed directly (no SDK needed).

    python benchmarks/demo_stages.py [--requests 200] [--batch-size 8]

The variants alternate request by request so that machine noise hits both alike.
"""
import argparse
import statistics
import time

import torch

from instrument.demo import batches, load_sentences
from instrument.demo.service import STAGE_NAMES, EmbeddingService, load_model, mean_pool


def timed_request(service, texts):
    inputs, t = service.inputs, [time.perf_counter_ns()]
    with torch.inference_mode():
        ids, lengths = inputs.tokenize(texts)
        t.append(time.perf_counter_ns())
        mask = inputs.attention_mask(lengths, ids.shape[1])
        t.append(time.perf_counter_ns())
        hidden = service.model(input_ids=ids, attention_mask=mask).last_hidden_state
        t.append(time.perf_counter_ns())
        pooled = mean_pool(hidden, mask)
        t.append(time.perf_counter_ns())
        torch.nn.functional.normalize(pooled, p=2, dim=1).cpu()
        t.append(time.perf_counter_ns())
    steps = [(b - a) / 1e6 for a, b in zip(t, t[1:])]
    return [t[-1] / 1e6 - t[0] / 1e6] + steps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    model = load_model("cpu")
    services = {v: EmbeddingService(v, "cpu", model=model) for v in ("baseline", "optimized")}
    work = list(batches(load_sentences(), args.requests + 2, args.batch_size))
    samples = {v: [] for v in services}
    for i, texts in enumerate(work):
        for variant, service in services.items():
            row = timed_request(service, texts)
            if i >= 2:  # warm-up
                samples[variant].append(row)
    print(f"median ms over {args.requests} requests of {args.batch_size} sentences, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'stage':<16}{'baseline':>10}{'optimized':>11}{'ratio':>8}")
    for k, name in enumerate(STAGE_NAMES):
        b = statistics.median(r[k] for r in samples["baseline"])
        o = statistics.median(r[k] for r in samples["optimized"])
        print(f"{name:<16}{b:>10.3f}{o:>11.3f}{b / o:>7.2f}x")


if __name__ == "__main__":
    main()
