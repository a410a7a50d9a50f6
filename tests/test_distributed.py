"""One view of a torch.distributed job (gloo, CPU): real jobs of several ranks under torchrun and
torch.multiprocessing.spawn (tests/distributed_job.py), read through instrument.distributed.gather, the
parts `instrument run` writes, `instrument merge --by-rank` and `instrument report --ranks`.

Rank 2 sleeps 20 ms more than the others in `preprocess` every step: off-CPU time, which load barely
moves.  Every figure is checked against what the job timed itself, with perf_counter_ns, in the same run.
"""
import json
import os
import statistics
import signal
import subprocess
import sys

import pytest

from instrument.analysis.ranks import rank_view
from instrument.snapshot import Snapshot
from snapfactory import ROOT, cli, env

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this torch build")

JOB = os.path.join(ROOT, "tests", "distributed_job.py")
STEPS, DELAY_MS, SLOW = 40, 20.0, 2
STAGES = (("step",), ("step", "preprocess"), ("step", "dist.all_reduce"))


def figure(msg):
    print(f"\n[ranks figure] {msg}")


def torchrun(out, *args, nproc=4):
    """`instrument run -- torchrun --nproc_per_node N tests/distributed_job.py OUT ARGS` in `out`."""
    cmd = [sys.executable, "-m", "instrument", "run", "-o", str(out / "run.json"), "--keep-parts", "--no-report", "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), JOB, str(out),
           *map(str, args)]
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600, cwd=out)


def truths(out, ranks):
    return {r: json.loads((out / f"truth.{r}.json").read_text()) for r in ranks}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("job")
    r = torchrun(out, "--steps", STEPS, "--slow-rank", SLOW, "--delay-ms", DELAY_MS)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def check_view(snap, truth, world=4, slow=SLOW, steps=STEPS):
    """The view names the slow rank and preprocess, counts every call per rank exactly, and the others' wait
    in the all_reduce after it is the delay, both as the job timed them."""
    v = rank_view(snap)
    assert (v.world_size, v.ranks, v.missing, v.stopped) == (world, tuple(range(world)), (), ())
    for path in STAGES:
        assert {r: f["calls"] for r, f in snap[path].ranks.items()} == {r: steps for r in range(world)}, path
        assert all(f["errors"] == 0 for f in snap[path].ranks.values())
    s = v.straggler
    assert (s.rank, s.path, s.collective) == (slow, ("step", "preprocess"), ("step", "dist.all_reduce"))
    mean = {r: {k: statistics.fmean(t[k]) for k in ("preprocess_ns", "all_reduce_ns")} for r, t in truth.items()}
    others = [r for r in truth if r != slow]
    excess = mean[slow]["preprocess_ns"] - statistics.median(mean[r]["preprocess_ns"] for r in others)
    for r in range(world):   # each stage call lies inside the interval the job timed around it
        assert snap["step/preprocess"].ranks[r]["wall_ns"] <= sum(truth[r]["preprocess_ns"])
        assert snap["step/dist.all_reduce"].ranks[r]["wall_ns"] <= sum(truth[r]["all_reduce_ns"])
    assert s.excess_ns == pytest.approx(excess, rel=0.05)
    for r in others:
        own_wait = mean[r]["all_reduce_ns"] - mean[slow]["all_reduce_ns"]
        assert s.waits[r] == pytest.approx(own_wait, rel=0.05)   # the same intervals, timed twice
        assert s.waits[r] == pytest.approx(excess, rel=0.15)     # the others wait out the delay
    delay = statistics.fmean(truth[slow]["delay_ns"])
    figure(f"{world} ranks, {steps} steps: straggler rank {s.rank} in {'/'.join(s.path)}, +{s.excess_ns / 1e6:.2f} "
           f"ms/step (the job's own timers: +{excess / 1e6:.2f}; its sleep of {DELAY_MS:g} ms took {delay / 1e6:.2f}); "
           f"the others waited {', '.join(f'{w / 1e6:.2f}' for w in s.waits.values())} ms/step in all_reduce "
           f"({(s.wait_ns / (DELAY_MS * 1e6) - 1) * 100:+.1f} % from {DELAY_MS:g} ms, "
           f"{(s.wait_ns / excess - 1) * 100:+.1f} % from the measured delay); load {os.getloadavg()[0]:.1f}")
    return v


def test_gather_names_the_straggler_and_the_wait_it_caused(job):
    snap = Snapshot.load(job / "gathered.json")
    check_view(snap, truths(job, range(4)))
    assert sorted(m["rank"] for m in snap.meta["merged_from"]) == [0, 1, 2, 3]
    assert {m["local_rank"] for m in snap.meta["merged_from"]} == {0, 1, 2, 3}
    assert {m["pid"] for m in snap.meta["merged_from"]} == {t["pid"] for t in truths(job, range(4)).values()}


def test_the_parts_of_instrument_run_and_merge_by_rank_give_the_same_view(job):
    gathered = Snapshot.load(job / "gathered.json")
    parts = sorted((job / "run.parts").iterdir())
    # the four ranks: torchrun's own process recorded no stage, so it wrote no part (test_cli_ranks gives merge
    # such a part and checks it is left out)
    assert sorted(Snapshot.load(p).meta["distributed"]["rank"] for p in parts) == [0, 1, 2, 3]
    r = cli("merge", "--by-rank", *parts, "-o", job / "by_rank.json")
    assert r.returncode == 0, r.stderr
    assert "Straggler: rank 2 in step/preprocess" in r.stderr
    for name in ("run.json", "by_rank.json"):
        snap = Snapshot.load(job / name)
        check_view(snap, truths(job, range(4)))
        for path in STAGES:   # the same calls as gather saw: nothing ran after it
            assert snap[path].ranks == {r: dict(f, cpu_ns=snap[path].ranks[r]["cpu_ns"])
                                        for r, f in gathered[path].ranks.items()}
    r = cli("report", "--ranks", "--json", job / "run.parts")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["straggler"]["rank"], d["straggler"]["stage"], d["missing"]) == (2, "step/preprocess", [])
    assert d["steps"] == {str(r): STEPS for r in range(4)}
    r = cli("report", "--ranks", job / "run.json")
    assert r.returncode == 0 and r.stdout.startswith("Ranks: 4 of a world of 4"), r.stderr


def test_a_rank_killed_mid_job_others_keep_their_data_and_the_view_names_it(tmp_path):
    writer = tmp_path / "writer"
    writer.mkdir()
    r = torchrun(tmp_path, "--steps", STEPS, "--kill-rank", 3, "--kill-step", 10, "--writer", writer)
    assert r.returncode != 0 and "SIGKILL" in r.stderr
    snap = Snapshot.load(tmp_path / "run.json")      # the parts written at exit: the killed rank wrote none
    v = rank_view(snap)
    parts = sorted(p.name for p in (tmp_path / "run.parts").iterdir())
    assert (v.world_size, v.ranks, v.missing) == (4, (0, 1, 2), (3,)), (parts, r.stderr[-4000:])
    assert v.steps == {0: 10, 1: 10, 2: 10}         # every step each survivor completed (the 11th could not)
    assert all(f["calls"] in (10, 11) for f in snap["step/preprocess"].ranks.values())
    report = cli("report", "--ranks", tmp_path / "run.json")
    assert "Missing: rank 3: no snapshot" in report.stdout, report.stderr
    w = Snapshot.load(_merged(tmp_path, "w.json", writer))            # the writer kept the killed rank's steps
    assert {p: w[p].ranks[3]["calls"] for p in STAGES} == {p: 10 for p in STAGES}
    assert rank_view(w).missing == ()
    both = Snapshot.load(_merged(tmp_path, "both.json", writer, tmp_path / "run.parts"))
    for path in STAGES:   # the survivors' exit-time parts (their latest), the killed rank from its writer file
        assert both[path].ranks == {**{r: snap[path].ranks[r] for r in range(3)}, 3: w[path].ranks[3]}


def _merged(tmp_path, name, *inputs):
    r = cli("merge", "--by-rank", *inputs, "-o", tmp_path / name)
    assert r.returncode == 0, r.stderr
    return tmp_path / name


def test_spawned_ranks(tmp_path):
    r = subprocess.run([sys.executable, JOB, str(tmp_path), "--spawn", "2", "--slow-rank", "1", "--steps", "20"],
                       env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    snap = Snapshot.load(tmp_path / "gathered.json")
    v = check_view(snap, truths(tmp_path, range(2)), world=2, slow=1, steps=20)
    assert [m["local_rank"] for m in snap.meta["merged_from"]] == [None, None]   # no launcher to say
    assert v.hosts == {0: os.uname().nodename, 1: os.uname().nodename}


def test_instrument_run_as_one_rank_writes_that_ranks_file(tmp_path):
    prog = "import instrument\nwith instrument.stage('step'):\n    pass\n"
    for rank in (0, 1):
        r = subprocess.run([sys.executable, "-m", "instrument", "run", "-o", "run.json", "--no-report", "--",
                            sys.executable, "-c", prog], env=dict(env(), RANK=str(rank), WORLD_SIZE="2",
                                                                  LOCAL_RANK=str(rank)),
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 0 and f"run.rank{rank}.json" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rank0.json", "run.rank1.json"]
    r = cli("report", "--ranks", "--json", tmp_path / "run.rank0.json", tmp_path / "run.rank1.json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] == {"0": 1, "1": 1}


BLOCKED = """
import datetime, os, sys, torch, torch.distributed as dist, instrument
out, rank = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=600))
with instrument.stage("setup"):
    grad = torch.ones(16)
if rank == 1:
    sys.stdin.readline()           # holds back its part of the collective until the test lets it go
print("blocked", os.getpid(), flush=True)
with instrument.stage("all_reduce"):
    dist.all_reduce(grad)          # rank 0 waits here, in native code that a signal does not interrupt
"""


def _blocked(pid):
    """Whether the process's main thread sleeps in the kernel, three looks in a row 50 ms apart."""
    import time
    for _ in range(3):
        time.sleep(0.05)
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "S":
                return False
    return True


def test_sigterm_to_a_rank_blocked_in_a_collective_still_saves_its_part(tmp_path):
    """A launcher's SIGTERM to a rank waiting in a collective for a peer that will not come: Python runs a signal
    handler only between bytecodes, so the watcher thread that the signal wakes saves the snapshot and ends the
    process by the signal, while the peer still holds the collective back."""
    from instrument import cli as cli_mod
    (tmp_path / "job.py").write_text(BLOCKED)
    job = [sys.executable, str(tmp_path / "job.py"), str(tmp_path)]
    held = subprocess.Popen(job + ["1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env())
    p = None
    try:
        p = subprocess.Popen(job + ["0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=cli_mod.run_env(str(tmp_path / "r.json"), environ=env()))
        word, pid = p.stdout.readline().split()
        assert word == "blocked", p.stderr.read()
        while not _blocked(int(pid)):   # inside the collective, not between bytecodes
            pass
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=300)          # ended while rank 1 still holds the collective back
        assert held.poll() is None and p.returncode == -signal.SIGTERM, err
        snap = Snapshot.load(tmp_path / "r.parts" / f"r.{pid}.json")
        assert snap["setup"].calls == 1 and snap.meta["pid"] == int(pid)
    finally:
        for q in (p, held):
            if q is not None:
                q.kill()
                q.communicate()
