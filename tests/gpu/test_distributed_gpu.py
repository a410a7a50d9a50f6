"""The NCCL/CUDA path of instrument.distributed; skipped where CUDA or NCCL is absent.

    bash tests/gpu/run_gpu_checks.sh        (or: PYTHONPATH=. python -m pytest tests/gpu -v -s)

- A collective's stage is timed on the device with CUDA events, and the host does not wait for it.
- gather() on an NCCL job sends over a gloo group made for it: no GPU memory is used.
- With two GPUs or more: a job of two NCCL ranks where rank 1 keeps its GPU busy 20 ms longer before
  each all_reduce; the view measures the collective on the device and names the wait.
"""
import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import instrument  # noqa: E402
import instrument.distributed  # noqa: E402
from instrument.analysis.ranks import rank_view  # noqa: E402
from instrument.live import distributed as live_distributed  # noqa: E402
from test_gpu import figure, gpu_on, sleep_cycles  # noqa: E402,F401  (gpu_on: GPU timing on around every test)

dist = torch.distributed
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_available()
                                or not dist.is_nccl_available(),
                                reason="CUDA or NCCL is not available (no GPU, or a CPU-only torch build)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def nccl(tmp_path_factory):
    torch.cuda.set_device(0)
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    live_distributed._remembered = None
    live_distributed._side = (None, None)


def test_a_collective_is_timed_on_the_device_without_waiting_for_it(nccl):
    x = torch.ones(1 << 22, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    instrument.reset()
    ref, host = [], []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        with instrument.stage("step"):
            dist.all_reduce(x)
        host.append(time.perf_counter() - t0)
        e1.record()
        ref.append((e0, e1))
    snap = instrument.snapshot()
    torch.cuda.synchronize()
    g = snap["step/dist.all_reduce"].gpu
    ref_ns = sum(e0.elapsed_time(e1) for e0, e1 in ref) * 1e6
    figure(f"NCCL all_reduce of 16 MiB, one rank: device {g['total_ns'] / 20 / 1e3:.1f} µs/call against "
           f"cuda.Event {ref_ns / 20 / 1e3:.1f} µs around the stage; host {sum(host) / 20 * 1e6:.1f} µs/call")
    assert g["samples"] == 20 and g["dropped"] == 0 and g["errors"] == 0
    assert 0 < g["total_ns"] <= ref_ns * 1.02        # inside the events recorded around the stage
    busy = sleep_cycles(50)
    torch.cuda._sleep(busy)                           # the stream is busy for ~50 ms: the collective queues behind it
    t0 = time.perf_counter()
    with instrument.stage("queued"):
        dist.all_reduce(x)
    returned = time.perf_counter() - t0
    still_running = not torch.cuda.current_stream().query()
    assert still_running and returned < 0.02, "the stage waited for the device"
    assert instrument.snapshot()["queued/dist.all_reduce"].gpu["samples"] == 1


def test_gather_of_an_nccl_job_uses_a_gloo_group_and_no_gpu_memory(nccl):
    x = torch.ones(1024, device="cuda")
    with instrument.stage("step"):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    g = instrument.distributed.gather(dst=0)
    assert torch.cuda.memory_allocated() == before and torch.cuda.max_memory_allocated() == before
    assert dist.get_backend(live_distributed._side[1]) == "gloo"
    assert g["step/dist.all_reduce"].ranks[0]["calls"] == 1 and g["step/dist.all_reduce"].ranks[0]["gpu_ns"] > 0
    assert g.meta["merged_from"][0]["rank"] == 0
    assert instrument.snapshot().meta["distributed"]["backend"] == "nccl"


JOB = """
import json, os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
import instrument, instrument.distributed

def job(rank, out, cycles):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{out}/store", rank=rank, world_size=2)
    instrument.configure(gpu="on")
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    instrument.reset()
    for _ in range(20):
        with instrument.stage("step"):
            with instrument.stage("compute"):
                torch.cuda._sleep(cycles if rank == 1 else cycles // 20)
            dist.all_reduce(x)
    torch.cuda.synchronize()
    snap = instrument.distributed.gather(dst=0)
    if rank == 0:
        snap.save(f"{out}/gathered.json")
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(job, args=(sys.argv[1], int(sys.argv[2])), nprocs=2)
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: NCCL refuses two ranks on one device")
def test_two_nccl_ranks_the_wait_is_on_the_device(tmp_path):
    cycles = sleep_cycles(21)                  # rank 1: 21 ms of GPU work per step, rank 0: about 1 ms
    (tmp_path / "job.py").write_text(JOB)
    r = subprocess.run([sys.executable, str(tmp_path / "job.py"), str(tmp_path), str(cycles)],
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    from instrument.snapshot import Snapshot
    v = rank_view(Snapshot.load(tmp_path / "gathered.json"))
    coll = v.stage("step/dist.all_reduce")
    figure(f"two NCCL ranks: all_reduce device ms/step {json.dumps({r: round(x / 1e6, 2) for r, x in coll.per_step.items()})}"
           f", wait {json.dumps({r: round(x / 1e6, 2) for r, x in coll.wait.items()})}")
    assert coll.device and coll.slowest == 0 and coll.wait[0] > 15e6     # rank 0 waits on the device for rank 1
