"""GPU timing per stage, checked against CUDA events; skipped where CUDA is absent.

    bash tests/gpu/run_gpu_checks.sh        (or: PYTHONPATH=. python -m pytest tests/gpu -v -s)

Figures (GPU ms per stage vs torch.cuda.Event ms, host return µs) are printed with -s.
"""
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import instrument  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA is not available (no GPU, or a CPU-only torch build)")


def figure(msg):
    print(f"\n[gpu figure] {msg}")


@pytest.fixture(autouse=True)
def gpu_on(backend):
    torch.cuda.synchronize()
    instrument.configure(gpu="on")
    instrument.reset()
    yield
    torch.cuda.synchronize()


def sleep_cycles(ms):
    """torch.cuda._sleep cycles that keep the GPU busy for about `ms` milliseconds."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    e0.record()
    torch.cuda._sleep(10_000_000)
    e1.record()
    e1.synchronize()
    return int(ms / (e0.elapsed_time(e1) / 10_000_000))


def matmuls_beside_events(n):
    """n calls of stage `matmul` (4 products of 4096²) with CUDA events of their own inside: the truth."""
    a, b = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    instrument.reset()
    st, ref = instrument.stage("matmul"), []
    for _ in range(n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with st:
            e0.record()
            for _ in range(4):
                a @ b
            e1.record()
        ref.append((e0, e1))
    return ref


def test_gpu_time_matches_cuda_events():
    ref = matmuls_beside_events(20)
    g = instrument.snapshot()["matmul"].gpu
    torch.cuda.synchronize()
    ref_ms = sorted(e0.elapsed_time(e1) for e0, e1 in ref)
    figure(f"matmul stage: GPU {g['total_ns'] / 20 / 1e6:.3f} ms/stage (p50 {g['p50_ns'] / 1e6:.3f}) vs "
           f"cuda.Event {sum(ref_ms) / 20:.3f} ms/stage (p50 {ref_ms[10]:.3f})")
    assert g["samples"] == 20 and g["dropped"] == 0 and g["errors"] == 0
    assert g["total_ns"] == pytest.approx(sum(ref_ms) * 1e6, rel=0.10)
    assert g["p50_ns"] == pytest.approx(ref_ms[10] * 1e6, rel=0.10)


def test_stage_does_not_wait_for_the_gpu():
    cycles = sleep_cycles(50)
    st = instrument.stage("sleepy")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with st:
        torch.cuda._sleep(cycles)
    host = time.perf_counter() - t0
    still_running = not torch.cuda.current_stream().query()
    loop = []
    for _ in range(32):   # exits that try to resolve (every 16th) must not wait either
        t1 = time.perf_counter()
        with st:
            torch.cuda._sleep(cycles // 10)
        loop.append(time.perf_counter() - t1)
    g = instrument.snapshot()["sleepy"].gpu
    figure(f"~50 ms kernel: host return {host * 1e6:.0f} µs, GPU {g['max_ns'] / 1e6:.1f} ms; 32 x ~5 ms kernels: "
           f"host max {max(loop) * 1e6:.0f} µs, GPU total {g['total_ns'] / 1e6:.1f} ms")
    assert still_running, "the kernel had finished when the stage returned: the stage waited for it"
    assert host < 0.005 and max(loop) < 0.005
    assert g["samples"] == 33 and g["max_ns"] >= 40e6


def test_pool_overflow_is_counted():
    instrument.configure(gpu_events=4)
    x = torch.ones(16, device="cuda")
    x.add_(1)                 # the first launch of a kernel loads it (CUDA lazy loading), and that waits for the device
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles(300))   # the stream is busy: no pair can resolve
    for _ in range(100):
        with instrument.stage("tiny"):
            x.add_(1)
    g = instrument.snapshot()["tiny"].gpu
    figure(f"pool of 4: samples {g['samples']}, dropped {g['dropped']}")
    assert g["samples"] == 4 and g["dropped"] == 96 and g["errors"] == 0


def test_side_stream_is_the_one_timed():
    cycles, s = sleep_cycles(20), torch.cuda.Stream()
    with torch.cuda.stream(s):
        with instrument.stage("side"):
            torch.cuda._sleep(cycles)
    g = instrument.snapshot()["side"].gpu
    figure(f"side stream ~20 ms kernel: GPU {g['total_ns'] / 1e6:.1f} ms")
    assert g["samples"] == 1 and g["total_ns"] >= 15e6


def test_profile_attributes_kernels_to_stages():
    model, x = torch.nn.Linear(1024, 1024).cuda(), torch.randn(256, 1024, device="cuda")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with instrument.profile(activities=acts):
        for _ in range(3):
            with instrument.stage("forward"):
                model(x)
            with instrument.stage("scale"):
                x * 2
        torch.cuda.synchronize()
    snap = instrument.snapshot()
    fwd, sc = snap["forward"].ops, snap["scale"].ops
    figure(f"profiled forward: device {fwd['device_total_ns'] / 1e3:.1f} µs, top {fwd['by_device'][:2]}")
    assert fwd["device_total_ns"] > 0 and sc["device_total_ns"] > 0
    assert {r["name"] for r in fwd["by_device"]} & {"aten::addmm", "aten::mm", "aten::linear", "aten::matmul"}
    assert "aten::mul" in {r["name"] for r in sc["by_device"]}


def test_auto_turns_on_when_cuda_initialises():
    code = ("import instrument, torch\n"
            "assert not instrument.live.gpu.status()['timing'], 'on before CUDA was initialised'\n"
            "x = torch.ones(4, device='cuda')\n"
            "with instrument.stage('s'):\n"
            "    x.add_(1)\n"
            "g = instrument.snapshot()['s'].gpu; assert g and g['samples'] == 1, g\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_gpu_time_shows_in_every_output():
    """The `gpu` metric of the table, CSV, JSON, the HTML report, top and Prometheus: the CUDA events' time."""
    import csv
    import io
    import json
    import re
    from instrument import top
    from instrument.exporters import csv as as_csv, html, json as as_json, table
    from instrument.exporters.format import ms
    ref = matmuls_beside_events(10)
    torch.cuda.synchronize()
    snap = instrument.snapshot()
    truth = sum(e0.elapsed_time(e1) for e0, e1 in ref) * 1e6
    gpu = snap["matmul"].gpu["total_ns"]
    assert gpu == pytest.approx(truth, rel=0.10)
    text = table.render([snap], width=300).splitlines()
    assert "GPU ms" in text[0] and ms(gpu) in text[2].split(), text[:3]
    row = next(csv.DictReader(io.StringIO(as_csv.render([snap]))))
    assert float(row["gpu_ns"]) == gpu
    assert json.loads(as_json.render([snap]))[0]["gpu_ns"] == gpu
    page = html.render([snap])
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    assert data["after"]["stages"][0]["cells"]["gpu"][0] == gpu
    assert "GPU ms" in top.table_lines(snap, 1.0, width=300)[0]
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    from instrument.exporters import prometheus
    fams = {f.name: f for f in text_string_to_metric_families(prometheus.render([snap]))}
    assert fams["instrument_stage_gpu_seconds"].samples[0].value == pytest.approx(gpu / 1e9)
    figure(f"matmul: GPU {gpu / 1e6:.2f} ms in every output, cuda.Event {truth / 1e6:.2f} ms; verdict "
           f"{snap['matmul'].verdict['verdict']}; table row: {text[2].strip()}")


# ------------------------------------------------------------------ instrument.modules
class Busy(torch.nn.Module):
    """Keeps the GPU busy about `ms` per call, between CUDA events of its own: the truth to compare with."""

    def __init__(self, cycles):
        super().__init__()
        self.cycles, self.events = cycles, []

    def forward(self, x):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.cuda._sleep(self.cycles)
        e1.record()
        self.events.append((e0, e1))
        return x + 1


def test_gpu_time_per_module_matches_cuda_events_and_nothing_waits():
    model = torch.nn.Sequential(Busy(sleep_cycles(8)), Busy(sleep_cycles(2)))
    x = torch.zeros(4, device="cuda")
    with instrument.modules(model, depth=1):
        model(x)
        torch.cuda.synchronize()
        instrument.reset()
        for m in model:
            m.events.clear()
        for _ in range(10):
            model(x)
        busy_after_return = not torch.cuda.current_stream().query()   # the call returned with kernels queued
        torch.cuda.synchronize()
        snap = instrument.snapshot()
    assert busy_after_return, "the module stages waited for the GPU"
    for i, m in enumerate(model):
        g = snap["Sequential", str(i)].gpu
        ref_ns = sum(e0.elapsed_time(e1) for e0, e1 in m.events) * 1e6
        figure(f"module {i}: GPU {g['total_ns'] / 1e6:.2f} ms in {g['samples']} calls vs cuda.Event "
               f"{ref_ns / 1e6:.2f} ms")
        assert g["samples"] == 10 and g["errors"] == 0
        assert g["total_ns"] == pytest.approx(ref_ns, rel=0.10)
    root = snap["Sequential"].gpu
    assert root["total_ns"] >= 0.95 * sum(snap["Sequential", str(i)].gpu["total_ns"] for i in range(2))


def test_bert_modules_on_cuda_each_have_gpu_time():
    transformers = pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "auto"))
    from module_tree import expected_tree
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=256, vocab_size=1000)
    model = transformers.BertModel(config).cuda().eval()
    ids = torch.randint(0, 1000, (8, 64), device="cuda")
    with instrument.modules(model, depth=2), torch.inference_mode():
        for _ in range(5):
            model(input_ids=ids)
        torch.cuda.synchronize()
        snap = instrument.snapshot()
    assert {s.path for s in snap} == expected_tree(model, 2, "BertModel")
    assert all(s.calls == 5 and s.gpu and s.gpu["samples"] == 5 for s in snap)
    enc = snap["BertModel", "encoder"].gpu
    figure(f"BertModel encoder: GPU {enc['total_ns'] / 5e3:.1f} µs per call, "
           f"{len(snap)} module stages each with GPU time")
