"""GPU time per module from instrument.modules, checked against CUDA events; skipped where CUDA is absent.

    PYTHONPATH=. python -m pytest tests/gpu/test_gpu_modules.py -v -s
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import instrument  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "auto"))
from module_tree import expected_tree  # noqa: E402

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


def cycles_per_ms():
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    e0.record()
    torch.cuda._sleep(10_000_000)
    e1.record()
    e1.synchronize()
    return 10_000_000 / e0.elapsed_time(e1)


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
    per_ms = cycles_per_ms()
    model = torch.nn.Sequential(Busy(int(8 * per_ms)), Busy(int(2 * per_ms)))
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
