"""CUDA memory per stage (csrc/memory.h with torch's allocator as the gauge), checked against
torch.cuda.max_memory_allocated measured around each lone stage; skipped where CUDA is absent.

    PYTHONPATH=. python -m pytest tests/gpu/test_gpu_memory.py -v -s
"""
import pytest

torch = pytest.importorskip("torch")
import instrument  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA is not available (no GPU, or a CPU-only torch build)")
MiB = 1 << 20


@pytest.fixture(autouse=True)
def cuda_memory():
    torch.cuda.init()
    instrument.configure(memory="host,cuda")
    instrument.reset()
    yield


def _outer():
    a = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del a
    _inner()


def _inner():
    b = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    c = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
    del b, c


def _lone_peak(work):
    """torch's own peak above the start, around a lone run of `work` (no stage)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    work()
    return torch.cuda.max_memory_allocated() - start


def test_nested_stages_hold_their_peaks_against_torch_s_own():
    truth_outer, truth_inner = _lone_peak(_outer), _lone_peak(_inner)
    for _ in range(5):
        with instrument.stage("outer"):
            a = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
            del a
            with instrument.stage("inner"):
                _inner()
    snap = instrument.snapshot()
    outer, inner = snap["outer"].memory_of("cuda:0"), snap["outer/inner"].memory_of("cuda:0")
    print(f"\n[gpu figure] cuda:0 peak outer {outer['peak_mean'] / MiB:.1f} MiB (torch {truth_outer / MiB:.1f}), "
          f"inner {inner['peak_mean'] / MiB:.1f} MiB (torch {truth_inner / MiB:.1f})")
    assert outer["peak_mean"] == pytest.approx(truth_outer, rel=0.01)
    assert inner["peak_mean"] == pytest.approx(truth_inner, rel=0.01)
    assert snap["outer"].memory_of("cuda:0:reserved")["calls"] == outer["calls"]


def test_a_user_s_reset_peak_memory_stats_inside_a_stage_is_held_and_marked():
    truth = _lone_peak(lambda: torch.empty(128 * MiB, dtype=torch.uint8, device="cuda"))
    for _ in range(3):
        with instrument.stage("resets"):
            a = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
            del a
            torch.cuda.reset_peak_memory_stats()
    f = instrument.snapshot()["resets"].memory_of("cuda:0")
    assert f["marked"] == f["calls"] == 3
    assert f["peak_mean"] == pytest.approx(truth, rel=0.01)
