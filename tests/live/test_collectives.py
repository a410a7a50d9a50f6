"""torch.distributed on the live side: collectives as child stages, the rank in meta, gather() of one rank.
A real gloo group of one rank in this process; fresh interpreters for what happens before and after one.
The jobs of several ranks are in tests/test_distributed.py."""
import functools
import json
import time

import pytest

import instrument
import instrument.distributed
from conftest import run_python
from instrument.analysis.ranks import rank_view
from instrument.live import distributed as live_distributed
from instrument.snapshot import rank_figures

torch = pytest.importorskip("torch")
dist = torch.distributed
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this torch build")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    live_distributed._remembered = None   # the next tests' snapshots are of no rank


def test_collectives_are_child_stages_of_their_caller(group, backend):
    t = torch.ones(64)
    own = []
    with instrument.stage("step"):
        for _ in range(5):
            t0 = time.perf_counter_ns()
            dist.all_reduce(t)
            own.append(time.perf_counter_ns() - t0)
        dist.broadcast(t, 0)
        dist.barrier()
    dist.all_gather([torch.zeros(64)], t)   # outside any stage: a top-level stage of its own
    s = instrument.snapshot()
    calls = {s_.path: s_.calls for s_ in s}
    assert calls == {("step",): 1, ("step", "dist.all_reduce"): 5, ("step", "dist.broadcast"): 1,
                     ("step", "dist.barrier"): 1, ("dist.all_gather",): 1}
    ar = s["step/dist.all_reduce"]
    assert 0 < ar.wall_total <= sum(own)          # each call inside the interval the test timed around it
    assert ar.wall_max <= max(own)
    assert dist.all_reduce.__wrapped__ is dist.distributed_c10d.all_reduce
    assert dist.all_reduce.__name__ == "all_reduce" and dist.all_reduce.__doc__ == dist.distributed_c10d.all_reduce.__doc__
    assert s.meta["distributed"] == {"rank": 0, "world_size": 1, "local_rank": None, "backend": "gloo",
                                     "source": "torch.distributed", "collectives": "timed"}


def test_off_puts_torch_own_functions_back(group):
    own = dist.distributed_c10d.all_reduce
    instrument.configure(collectives=False)
    assert dist.all_reduce is own and instrument.snapshot().meta["distributed"]["collectives"] == "off"
    with instrument.stage("s"):
        dist.all_reduce(torch.ones(2))
    assert instrument.snapshot().get("s/dist.all_reduce") is None
    instrument.configure(collectives=True)
    assert dist.all_reduce is not own and dist.all_reduce.__wrapped__ is own
    instrument.configure(enabled=False)
    assert dist.all_reduce is own and dist.barrier is dist.distributed_c10d.barrier
    instrument.configure(enabled=True)
    ours = dist.all_reduce
    theirs = functools.wraps(ours)(lambda *a, **k: ours(*a, **k))   # another tool wrapped ours
    dist.all_reduce = theirs
    try:
        instrument.configure(collectives=False)
        assert dist.all_reduce is theirs                # theirs stays, and ours inside it no longer times
        instrument.reset()
        with instrument.stage("s"):
            dist.all_reduce(torch.ones(2))
        assert instrument.snapshot().get("s/dist.all_reduce") is None
    finally:
        dist.all_reduce = own
        instrument.configure(collectives=True)
    assert dist.all_reduce.__wrapped__ is own


def test_gather_of_one_rank_is_its_snapshot_per_rank(group, backend):
    for _ in range(3):
        with instrument.stage("step"):
            with instrument.stage("preprocess"):
                time.sleep(0.001)
            dist.all_reduce(torch.ones(16))
    before = instrument.snapshot()
    g = instrument.distributed.gather(dst=0)
    assert {s.path: s.ranks for s in g} == {s.path: {0: rank_figures(s)} for s in before}
    src = g.meta["merged_from"]
    assert len(src) == 1 and (src[0]["rank"], src[0]["world_size"], src[0]["pid"]) == (0, 1, before.meta["pid"])
    # judged as the rank judged it: off the CPU (its sleep), or waiting for one where a loaded machine kept the
    # thread in the run queue after the sleep
    assert g["step/preprocess"].verdict["verdict"] == before["step/preprocess"].verdict["verdict"] in \
        ("waiting", "cpu-starved")
    v = rank_view(g)
    assert v.ranks == (0,) and v.steps == {0: 3} and v.straggler is None
    assert instrument.snapshot().get("dist.all_gather") is None      # gather's own traffic is not the user's


def test_gather_refuses_a_rank_that_is_not_one(group):
    with pytest.raises(ValueError, match=r"^instrument.distributed.gather: dst must be a rank from 0 to 0, got 1$"):
        instrument.distributed.gather(dst=1)
    with pytest.raises(ValueError, match="got True"):
        instrument.distributed.gather(dst=True)


def test_the_rank_before_init_after_destroy_and_from_the_launcher(tmp_path):
    code = f"""
import json, sys
import instrument, instrument.distributed
import torch, torch.distributed as dist
out = {{"before": instrument.snapshot().meta.get("distributed")}}
try:
    instrument.distributed.gather()
except RuntimeError as e:
    out["gather"] = str(e)
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
dist.barrier()
dist.destroy_process_group()
out["after"] = instrument.snapshot().meta["distributed"]
print(json.dumps(out))
"""
    r = run_python(code, env={"INSTRUMENT_OUTPUT": str(tmp_path / "exit.json")})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["before"] is None
    assert out["gather"] == ("instrument.distributed.gather: torch.distributed is not initialized; call "
                             "torch.distributed.init_process_group first, then gather on every rank")
    assert out["after"] == {"rank": 0, "world_size": 1, "local_rank": None, "backend": "gloo",
                            "source": "torch.distributed", "collectives": "timed"}
    saved = json.loads((tmp_path / "exit.json").read_text())
    assert saved["meta"]["distributed"]["rank"] == 0 and saved["stages"][0]["path"] == ["dist.barrier"]

    no_torch = ("import json, sys, instrument\nwith instrument.stage('s'): pass\n"
                "print(json.dumps([instrument.snapshot().meta.get('distributed'), 'torch' in sys.modules]))")
    r = run_python(no_torch, env={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"rank": 3, "world_size": 4, "local_rank": 1, "backend": None,
                                     "source": "launcher environment", "collectives": "off"}, False]
    r = run_python(no_torch, env={"RANK": "three", "WORLD_SIZE": "4"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [None, False]
