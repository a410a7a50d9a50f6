"""A torch.distributed job (gloo, CPU) for the ranks tests: steps of `preprocess` then an all_reduce, one
rank slower in preprocess.

    torchrun --nproc_per_node 4 tests/distributed_job.py OUT [--steps N] [--slow-rank R] [--delay-ms D]
             [--kill-rank K --kill-step S] [--writer DIR]
    python tests/distributed_job.py OUT --spawn WORLD ...          (torch.multiprocessing.spawn)

Each rank times its own steps with perf_counter_ns and writes them to OUT/truth.<rank>.json (the source of
truth the tests compare with); rank 0 saves what instrument.distributed.gather returned as OUT/gathered.json.
The rank given by --kill-rank sends itself SIGKILL inside preprocess of step --kill-step.
"""
import argparse
import datetime
import json
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import instrument
import instrument.distributed

BASE_S = 0.002   # every rank's preprocess: off-CPU time, which load barely stretches


def job(spawned_rank, world, a):
    timeout = datetime.timedelta(seconds=120)
    if world:
        dist.init_process_group("gloo", init_method=f"file://{a.out}/store", rank=spawned_rank, world_size=world,
                                timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    if a.writer:
        instrument.start_snapshot_writer(a.writer, interval=3600)
    grad = torch.ones(4096)
    step, pre = instrument.stage("step"), instrument.stage("preprocess")
    truth = {"rank": rank, "pid": os.getpid(), "preprocess_ns": [], "all_reduce_ns": [], "delay_ns": []}
    for k in range(a.steps):
        with step:
            t0 = time.perf_counter_ns()
            with pre:
                if rank == a.kill_rank and k == a.kill_step:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(BASE_S)
                if rank == a.slow_rank:
                    d0 = time.perf_counter_ns()
                    time.sleep(a.delay_ms / 1000)
                    truth["delay_ns"].append(time.perf_counter_ns() - d0)
            t1 = time.perf_counter_ns()
            grad.fill_(1.0)
            dist.all_reduce(grad)
            t2 = time.perf_counter_ns()
        truth["preprocess_ns"].append(t1 - t0)
        truth["all_reduce_ns"].append(t2 - t1)
    assert grad[0].item() == dist.get_world_size()   # the collectives really ran
    with open(os.path.join(a.out, f"truth.{rank}.json"), "w") as f:
        json.dump(truth, f)
    snap = instrument.distributed.gather(dst=0)
    if rank == 0:
        snap.save(os.path.join(a.out, "gathered.json"))
    else:
        assert snap is None
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--writer")
    p.add_argument("--spawn", type=int, default=0, metavar="WORLD")
    a = p.parse_args()
    if a.spawn:
        mp.spawn(job, args=(a.spawn, a), nprocs=a.spawn)
    else:
        job(None, 0, a)


if __name__ == "__main__":
    main()
