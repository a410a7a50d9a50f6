"""torch.profiler ranges for stages, operator attribution, hook composition, GPU
bookkeeping (with stand-in events; real CUDA checks are in tests/gpu)."""
import json
import sys
import time

import pytest

import instrument
from instrument.live import backend as live_backend, collector as _collector, gpu, hooks as _hooks, torch_profiler
from instrument.snapshot import TOP_OPS, gpu_fields, merge_gpu, merge_ops
from conftest import run_python

torch = pytest.importorskip("torch")
CPU = [torch.profiler.ProfilerActivity.CPU]


def build():
    """A model whose forward, loss and preprocess are stages of the backend in use (made per test)."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 4)

        @instrument.region("forward")
        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    @instrument.region("preprocess")
    def preprocess(x):
        return (x - x.mean()) / (x.std() + 1e-6)

    @instrument.region("loss")
    def loss(y, t):
        return torch.nn.functional.mse_loss(y, t)
    model = Model()

    def step(x, t):
        with instrument.stage("step"):
            return loss(model(preprocess(x)), t)
    return step


def op_names(ops):
    return {r["name"] for r in ops["by_self_cpu"]}


@pytest.fixture
def data(backend):
    torch.manual_seed(0)
    return build(), torch.randn(16, 32), torch.randn(16, 4)


def test_profile_attributes_ops_to_stages(data):
    step, x, t = data
    with instrument.profile(activities=CPU) as prof:
        for _ in range(3):
            step(x, t)
    snap = instrument.snapshot()
    fwd, pre, ls = snap["step/forward"], snap["step/preprocess"], snap["step/loss"]
    assert fwd.ops["profiled_calls"] == pre.ops["profiled_calls"] == ls.ops["profiled_calls"] == 3
    assert op_names(fwd.ops) & {"aten::addmm", "aten::linear"}
    assert not op_names(pre.ops) & {"aten::addmm", "aten::linear", "aten::mse_loss"}
    assert "aten::mse_loss" in op_names(ls.ops) and "aten::mse_loss" not in op_names(fwd.ops)
    for s in (fwd, pre, ls):
        assert 0 < sum(r["self_cpu_ns"] for r in s.ops["by_self_cpu"]) <= s.wall_total
        assert s.ops["by_device"] == [] and s.ops["device_total_ns"] == 0
        assert len(s.ops["by_self_cpu"]) <= TOP_OPS
    keys = {e.key for e in prof.key_averages()}
    assert {"step", "forward", "preprocess", "loss"} <= keys
    assert snap.meta["torch_profiler"]["profiles"] == 1
    assert snap.meta["internal_failures"] == 0


def test_stage_names_in_chrome_trace(data, tmp_path):
    step, x, t = data
    with instrument.profile(activities=CPU) as prof:
        step(x, t)
    out = tmp_path / "trace.json"
    prof.export_chrome_trace(str(out))
    names = {e.get("name") for e in json.loads(out.read_text())["traceEvents"]}
    assert {"step", "forward", "preprocess", "loss"} <= names


@pytest.fixture(params=[torch_profiler.FAST, torch_profiler.OPS])
def mechanism(request, monkeypatch):
    """The range mechanism: torch's _RecordFunctionFast, or the record_function ops a torch without it gets."""
    if request.param == torch_profiler.OPS:
        monkeypatch.delattr(torch._C._profiler, "_RecordFunctionFast", raising=False)
    elif not hasattr(torch._C._profiler, "_RecordFunctionFast"):
        pytest.skip("this torch has no _RecordFunctionFast")
    return request.param


def test_no_record_function_without_a_profiler(data, monkeypatch, mechanism):
    step, x, t = data
    calls = []
    if mechanism == torch_profiler.OPS:   # the torch op the stage calls
        real = torch.ops.profiler._record_function_enter_new

        def counting(name, *args):
            if name in ("step", "forward", "preprocess", "loss"):
                calls.append(name)
            return real(name, *args)
        monkeypatch.setattr(torch.ops.profiler, "_record_function_enter_new", counting)
    else:                                 # the enter hook: _RecordFunctionFast(name).__enter__()
        real_enter = torch_profiler._enter_fast

        def counting(name):
            if name in ("step", "forward", "preprocess", "loss"):
                calls.append(name)
            return real_enter(name)
        monkeypatch.setattr(torch_profiler, "_enter_fast", counting)
    for _ in range(5):
        step(x, t)
    assert calls == [] and _hooks.active() == ()
    with torch.profiler.profile(activities=CPU) as prof:
        for _ in range(2):
            step(x, t)
        assert torch_profiler.status()["range"] == mechanism
    assert sorted(calls) == sorted(["step", "preprocess", "forward", "loss"] * 2)
    assert next(e for e in prof.key_averages() if e.key == "forward").count == 2   # none from before it started
    del calls[:]
    step(x, t)
    assert calls == [] and _hooks.active() == ()


def test_stage_range_in_key_averages_and_chrome_trace(backend, mechanism, tmp_path):
    a = torch.randn(32, 32)
    with instrument.profile(activities=CPU) as prof:
        assert torch_profiler.status()["range"] == mechanism and torch_profiler.status()["ranges"]
        for _ in range(3):
            with instrument.stage("matmul"):
                torch.mm(a, a)
    assert next(e for e in prof.key_averages() if e.key == "matmul").count == 3
    out = tmp_path / "trace.json"
    prof.export_chrome_trace(str(out))
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in events if e["name"] == "matmul"]
    mms = [e for e in events if e["name"] == "aten::mm"]
    assert len(ranges) == len(mms) == 3

    def encloses(r, e):
        return (r["pid"], r["tid"]) == (e["pid"], e["tid"]) and r["ts"] <= e["ts"] and \
            e["ts"] + e["dur"] <= r["ts"] + r["dur"]
    assert all(sum(encloses(r, m) for r in ranges) == 1 for m in mms)
    ops = instrument.snapshot()["matmul"].ops   # attribution reads the same events
    assert ops["profiled_calls"] == 3 and next(r for r in ops["by_self_cpu"] if r["name"] == "aten::mm")["calls"] == 3
    assert torch_profiler.status()["range"] == mechanism and not torch_profiler.status()["ranges"]


def test_fast_range_entered_without_profiler_state_closes_quietly(backend):
    if not hasattr(torch._C._profiler, "_RecordFunctionFast"):
        pytest.skip("this torch has no _RecordFunctionFast")
    h = torch._C._profiler._RecordFunctionFast("early")
    h.__enter__()   # no profiler state on this thread yet: nothing is opened
    with torch.profiler.profile(activities=CPU) as prof:
        torch_profiler._exit_fast(h)   # torch would raise: a profiler records now, and h holds no range
        with instrument.stage("later"):
            pass
    assert {e.key for e in prof.key_averages()} >= {"later"} and instrument.snapshot().meta["internal_failures"] == 0


def test_interleaved_asyncio_stages_close_their_own_ranges(backend, mechanism):
    import asyncio
    a = torch.randn(16, 16)

    async def task(name):
        for _ in range(3):
            with instrument.stage(name):
                torch.mm(a, a)
                await asyncio.sleep(0)   # the other task enters and exits its stage meanwhile: ranges end out of order

    async def main():
        await asyncio.gather(task("ta"), task("tb"))
    with instrument.profile(activities=CPU) as prof:
        asyncio.run(main())
        assert torch_profiler.status()["range"] == mechanism
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts["ta"] == counts["tb"] == 3 and counts["aten::mm"] == 6
    snap = instrument.snapshot()
    assert snap["ta"].calls == snap["tb"].calls == 3 and snap.meta["internal_failures"] == 0
    assert _hooks.active() == ()


@pytest.mark.parametrize("kind", ["torch.profiler", "autograd", "start/stop"])
def test_plain_torch_profilers_get_stage_ranges(data, kind):
    step, x, t = data
    if kind == "torch.profiler":
        with torch.profiler.profile(activities=CPU) as prof:
            step(x, t)
    elif kind == "autograd":
        with torch.autograd.profiler.profile() as prof:
            step(x, t)
    else:
        prof = torch.profiler.profile(activities=CPU)
        prof.start()
        step(x, t)
        prof.stop()
    assert {"step", "forward", "loss"} <= {e.key for e in prof.key_averages()}
    assert _hooks.active() == ()
    assert instrument.snapshot()["step/forward"].ops is None   # only instrument.profile attributes


def test_schedule_only_active_steps_are_ranges(data):
    step, x, t = data
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    seen = []
    with instrument.profile(activities=CPU, schedule=sched, on_trace_ready=seen.append) as prof:
        for _ in range(6):
            step(x, t)
            prof.step()
    assert seen == [prof]
    snap = instrument.snapshot()
    assert snap["step"].calls == 6 and snap["step"].ops["profiled_calls"] == 2
    assert snap["step/forward"].ops["profiled_calls"] == 2


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_profiler_stopping_inside_a_stage(data):
    step, x, t = data
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=2)
    with instrument.profile(activities=CPU, schedule=sched) as prof:
        for _ in range(4):
            with instrument.stage("outer"):
                step(x, t)
                prof.step()   # recording stops and starts with "outer" open
    snap = instrument.snapshot()
    assert snap.meta["internal_failures"] == 0 and _hooks.active() == ()
    assert snap["outer/step/forward"].ops["profiled_calls"] >= 1


def test_accumulated_cycles_are_folded_once(data):
    step, x, t = data
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=3)
    with instrument.profile(activities=CPU, schedule=sched, acc_events=True) as prof:
        for _ in range(6):
            step(x, t)
            prof.step()
    assert instrument.snapshot()["step/loss"].ops["profiled_calls"] == 3


def test_worker_thread_stages_opened_before_recording(backend):
    import threading
    try:
        cfg = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)   # torch records other threads
    except (AttributeError, TypeError):
        pytest.skip("this torch cannot profile all threads")
    started, stop = threading.Event(), threading.Event()

    def worker():
        with instrument.stage("worker"):
            started.set()
            while not stop.is_set():
                with instrument.stage("item"):
                    torch.ones(16, 16).matmul(torch.ones(16, 16))
                time.sleep(0.002)   # a few dozen items while recording
    th = threading.Thread(target=worker)
    th.start()
    started.wait()
    try:
        with instrument.profile(activities=CPU, experimental_config=cfg):
            stop.wait(0.1)
    finally:
        stop.set()
        th.join()
    snap = instrument.snapshot()
    assert snap.get("item") is None and "aten::mm" in op_names(snap["worker/item"].ops)


def test_profile_opened_inside_a_stage_keeps_the_full_path(data):
    step, x, t = data
    with instrument.stage("serve"):
        with instrument.profile(activities=CPU):
            step(x, t)
    snap = instrument.snapshot()
    assert "aten::mse_loss" in op_names(snap["serve/step/loss"].ops)
    assert snap.get("step/loss") is None


def test_exception_in_a_profiled_stage(backend):
    with instrument.profile(activities=CPU) as prof:
        with pytest.raises(KeyError):
            with instrument.stage("boom"):
                torch.ones(4).sum()
                raise KeyError("x")
    snap = instrument.snapshot()
    assert snap["boom"].errors == 1 and snap["boom"].ops["profiled_calls"] == 1
    assert "boom" in {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("order", ["torch first", "instrument first"])
def test_either_import_order(order):
    imports = "import torch, instrument" if order == "torch first" else "import instrument, torch"
    r = run_python(imports + "\n"
                   "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:\n"
                   "    with instrument.stage('work'):\n"
                   "        torch.ones(8).sum()\n"
                   "assert 'work' in {e.key for e in p.key_averages()}, 'no stage range'\n"
                   "import sys; assert not any(type(f).__name__ == '_Watcher' for f in sys.meta_path)\n")
    assert r.returncode == 0, r.stderr[-2000:]


def test_session_already_recording_when_instrument_sees_torch():
    r = run_python("import torch\n"
                   "p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]); p.start()\n"
                   "import instrument\n"
                   "with instrument.stage('late'):\n"
                   "    torch.ones(8).sum()\n"
                   "p.stop(); assert 'late' in {e.key for e in p.key_averages()}\n"
                   "assert instrument.live.torch_profiler.status()['recording_sessions'] == 0\n")
    assert r.returncode == 0, r.stderr[-2000:]


def test_torch_off(data):
    instrument.configure(torch="off")
    step, x, t = data
    with torch.profiler.profile(activities=CPU) as prof:
        step(x, t)
    assert "forward" not in {e.key for e in prof.key_averages()}
    assert instrument.snapshot().meta["torch_profiler"]["state"].startswith("off")


def test_ops_survive_save_load_and_merge(data, tmp_path):
    step, x, t = data
    with instrument.profile(activities=CPU):
        step(x, t)
    snap = instrument.snapshot()
    back = instrument.Snapshot.load(snap.save(tmp_path / "s.json"))
    assert back["step/forward"].ops == snap["step/forward"].ops
    m = back.merge(snap)["step/forward"].ops
    one = {r["name"]: r for r in snap["step/forward"].ops["by_self_cpu"]}
    for r in m["by_self_cpu"]:
        assert r["calls"] == 2 * one[r["name"]]["calls"] and r["self_cpu_ns"] == 2 * one[r["name"]]["self_cpu_ns"]
    assert m["profiled_calls"] == 2


def test_merge_ops_sums_and_reranks():
    def row(n, c, s, d=0):
        return {"name": n, "calls": c, "self_cpu_ns": s, "cpu_total_ns": s, "device_ns": d}
    a = {"by_self_cpu": [row("x", 1, 10), row("y", 1, 5, 7)], "by_device": [row("y", 1, 5, 7)],
         "device_total_ns": 7, "profiled_calls": 1}
    b = {"by_self_cpu": [row("y", 2, 20)], "by_device": [], "device_total_ns": 0, "profiled_calls": 2}
    m = merge_ops(a, b)
    assert [r["name"] for r in m["by_self_cpu"]] == ["y", "x"] and m["by_self_cpu"][0]["calls"] == 3
    assert m["by_self_cpu"][0]["self_cpu_ns"] == 25 and m["by_device"] == [row("y", 3, 25, 7)]
    assert m["device_total_ns"] == 7 and m["profiled_calls"] == 3
    assert merge_ops(None, b) == b and merge_ops(a, None) == a
    many = {"by_self_cpu": [row(f"op{i}", 1, i) for i in range(8)], "by_device": [], "device_total_ns": 0,
            "profiled_calls": 1}
    assert len(merge_ops(many, {**many, "by_self_cpu": [row(f"z{i}", 1, i) for i in range(8)]})
               ["by_self_cpu"]) == TOP_OPS


# ------------------------------------------------------------ hook plumbing
class Handle:
    def __init__(self, log, tag, name):
        self.log, self.tag, self.name = log, tag, name


def fake(log, tag):
    cls = type(f"Handle{tag}", (Handle,), {})

    def enter(name):
        log.append((tag, "enter", name, _collector.backend.current_path()))
        return cls(log, tag, name)

    def exit(h):
        if type(h) is not cls:
            return _hooks.close(h)
        log.append((tag, "exit", h.name))
    return enter, exit, cls


def test_hooks_compose_and_survive_changes(backend):
    log = []
    ea, xa, ca = fake(log, "A")
    eb, xb, cb = fake(log, "B")
    try:
        _hooks.activate("A", ea, xa, ca)
        with instrument.stage("s1"):
            _hooks.activate("B", eb, xb, cb)   # s1 entered under A alone, exits under A+B
            with instrument.stage("s2"):
                _hooks.deactivate("A")         # s2 entered under A+B, exits under B alone
        _hooks.deactivate("B")
        with instrument.stage("s3"):
            pass
    finally:
        _hooks.deactivate("A")
        _hooks.deactivate("B")
    assert log == [("A", "enter", "s1", ("s1",)), ("A", "enter", "s2", ("s1", "s2")),
                   ("B", "enter", "s2", ("s1", "s2")), ("B", "exit", "s2"), ("A", "exit", "s2"),
                   ("A", "exit", "s1")]
    assert instrument.snapshot().meta["internal_failures"] == 0


def test_hooks_follow_the_backend():
    log = []
    e, x, c = fake(log, "A")
    try:
        _hooks.activate("A", e, x, c)
        from instrument.live import pure as _pure
        other = _pure if _collector.backend is not _pure else None
        if other is None:
            pytest.skip("only the pure backend is in use")
        old = _collector.backend
        _collector.use_backend(other)
        try:
            with instrument.stage("moved"):
                pass
            assert [l[:3] for l in log] == [("A", "enter", "moved"), ("A", "exit", "moved")]
        finally:
            _collector.use_backend(old)
        del log[:]
        with instrument.stage("back"):
            pass
        assert [l[:3] for l in log] == [("A", "enter", "back"), ("A", "exit", "back")]
    finally:
        _hooks.deactivate("A")


# ------------------------------------------------- GPU bookkeeping, no CUDA
def test_gpu_on_without_cuda_reports_why(backend):
    instrument.configure(gpu="on")
    with instrument.stage("g"):
        torch.ones(3)
    snap = instrument.snapshot()
    assert snap["g"].gpu is None and snap.meta["gpu"]["timing"] is False
    assert "without CUDA" in snap.meta["gpu"]["reason"] or "no CUDA device" in snap.meta["gpu"]["reason"]


class FakeEvent:
    """Stands in for torch.Event: done when the test says so, 'elapsed' = a fixed step."""
    clock, done_upto = 0, 0

    def __init__(self):
        self.t = None

    def record(self):
        FakeEvent.clock += 1
        self.t = FakeEvent.clock

    def query(self):
        return self.t <= FakeEvent.done_upto

    def synchronize(self):
        FakeEvent.done_upto = max(FakeEvent.done_upto, self.t)

    def elapsed_time(self, end):
        return (end.t - self.t) * 0.001   # ms: 1 µs per tick


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(gpu, "_new_event", FakeEvent)
    monkeypatch.setattr(gpu, "_on", True)
    gpu._pending.clear()
    gpu._free.clear()
    FakeEvent.clock = FakeEvent.done_upto = 0
    _hooks.activate("gpu", gpu._enter, gpu._exit, gpu._Pending)
    yield
    _hooks.deactivate("gpu")
    gpu._pending.clear()
    gpu._free.clear()


def test_gpu_pool_overflow_is_counted(backend, fake_gpu, monkeypatch):
    monkeypatch.setattr(gpu, "_bound", 4)
    for _ in range(100):            # nothing completes: the pool fills
        with instrument.stage("k"):
            pass
    assert len(gpu._pending) == 4
    snap = instrument.snapshot()    # waits for the newest pending event, resolves all
    g = snap["k"].gpu
    assert g["samples"] == 4 and g["dropped"] == 96 and g["errors"] == 0
    assert g["total_ns"] == 4 * 1000 and g["p50_ns"] == pytest.approx(1000, rel=0.01)
    assert snap.meta["gpu"]["dropped"] == 96 and not gpu._pending


def test_gpu_resolves_at_later_exits_and_nests(backend, fake_gpu):
    for _ in range(40):
        with instrument.stage("outer"):
            with instrument.stage("inner"):
                pass
        FakeEvent.done_upto = FakeEvent.clock    # the device keeps up
    assert len(gpu._pending) < 2 * 40              # resolved along the way, not only at snapshot
    snap = instrument.snapshot()
    assert snap["outer"].gpu["samples"] == snap["outer/inner"].gpu["samples"] == 40
    assert snap["outer/inner"].gpu["total_ns"] == 40 * 1000 and snap["outer"].gpu["total_ns"] == 40 * 3000
    m = snap.merge(snap)["outer"].gpu
    assert m["samples"] == 80 and m["total_ns"] == 240000 and m["hist"]["buckets"] == [[
        snap["outer"].gpu["hist"]["buckets"][0][0], 80]]
    instrument.reset()
    assert instrument.snapshot().get("outer") is None


def test_gpu_merge_stats_exact():
    a = gpu_fields(*[300, 3, 1, 0, 50, 200, {gpu._hist.index(50): 1,
                                              gpu._hist.index(200): 2}])
    b = gpu_fields(*[1000, 1, 0, 2, 1000, 1000, {gpu._hist.index(1000): 1}])
    m = merge_gpu(a, b)
    assert (m["total_ns"], m["samples"], m["dropped"], m["errors"], m["min_ns"], m["max_ns"]) == (1300, 4, 1, 2, 50,
                                                                                              1000)
    assert m["mean_ns"] == 325 and sum(c for _, c in m["hist"]["buckets"]) == 4
    assert merge_gpu(None, b) == b and merge_gpu(a, None) == a


def test_status_without_torch_profiler_session():
    st = torch_profiler.status()
    assert st["torch"] == torch.__version__ and st["patched"] and st["recording_sessions"] == 0
    assert "cuda" in gpu.status() and sys.modules.get("torch") is torch
