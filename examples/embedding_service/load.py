"""Send a bounded number of /embed requests to the example service on 127.0.0.1; print latencies.

    python examples/embedding_service/load.py --port 8000 --requests 200 --concurrency 4
"""
import argparse
import asyncio
import statistics
import sys
import time

import httpx

from instrument.demo import batches, load_sentences

LOOPBACK = "127.0.0.1"
MAX_REQUESTS = 100_000


async def _send(client, url, payloads, concurrency):
    gate = asyncio.Semaphore(concurrency)
    latencies = []

    async def one(texts):
        async with gate:
            start = time.perf_counter()
            response = await client.post(url, json={"texts": texts})
            response.raise_for_status()
            latencies.append((time.perf_counter() - start) * 1e3)

    await asyncio.gather(*(one(texts) for texts in payloads))
    return latencies


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default=LOOPBACK, help="must be 127.0.0.1: this script only loads a local service")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args(argv)
    if args.host != LOOPBACK:
        print(f"load.py: refusing host {args.host!r}: only {LOOPBACK} is allowed", file=sys.stderr)
        return 2
    if not (1 <= args.requests <= MAX_REQUESTS and 1 <= args.concurrency <= 256 and 1 <= args.batch_size <= 64):
        print(f"load.py: --requests 1..{MAX_REQUESTS}, --concurrency 1..256, --batch-size 1..64", file=sys.stderr)
        return 2
    payloads = list(batches(load_sentences(), args.requests, args.batch_size))
    url = f"http://{LOOPBACK}:{args.port}/embed"

    async def run():
        async with httpx.AsyncClient(timeout=60.0, trust_env=False) as client:  # no proxies: loopback only
            return await _send(client, url, payloads, args.concurrency)

    start = time.perf_counter()
    latencies = asyncio.run(run())
    elapsed = time.perf_counter() - start
    print(f"{len(latencies)} requests, concurrency {args.concurrency}, {len(latencies) / elapsed:.1f} req/s")
    print(f"latency p50 {percentile(latencies, 0.5):.1f} ms, p99 {percentile(latencies, 0.99):.1f} ms, "
          f"mean {statistics.fmean(latencies):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
