"""instrument.add: items of the innermost open stage, per task and thread, merged exactly."""
import asyncio
import json
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

import instrument
from instrument.snapshot import Snapshot
from snapfactory import cli, env


def test_tokens_added_in_forward_sum_exactly(backend):
    rng = random.Random(5)
    added = []
    req, fwd = instrument.stage("request"), instrument.stage("forward")
    for _ in range(400):
        with req:
            instrument.add("requests")
            with fwd:
                n = rng.randrange(1, 513)
                added.append(n)
                instrument.add("tokens", n)
                instrument.add("padding_tokens", value=512 - n)
    s = instrument.snapshot()
    f = s["request/forward"]
    assert f.items["tokens"] == {"total": sum(added), "calls": 400}
    assert f.items["padding_tokens"] == {"total": 400 * 512 - sum(added), "calls": 400}
    assert s["request"].items == {"requests": {"total": 400, "calls": 400}}
    assert isinstance(f.items["tokens"]["total"], int)
    assert f.per_item_ns("tokens") == f.wall_total / sum(added)          # µs/token is total / tokens
    assert f.item_rate("tokens") == sum(added) / (f.wall_total / 1e9)    # tokens/s
    d = json.loads(s.to_json())
    assert {k: v for k, v in d["stages"][1]["items"].items()} == {k: dict(v) for k, v in f.items.items()}
    assert Snapshot.from_dict(d)["request/forward"].items == f.items


def test_items_in_asyncio_tasks_land_in_each_tasks_own_stage(backend):
    expect = {}

    async def worker(name, k):
        with instrument.stage(name):
            for i in range(50):
                instrument.add("samples", k)
                await asyncio.sleep(0)     # the other tasks run their adds in between
        expect[name] = 50 * k

    async def main():
        with instrument.stage("batch"):
            await asyncio.gather(*(worker(f"task{k}", k) for k in range(1, 6)))
            instrument.add("batches")

    asyncio.run(main())
    s = instrument.snapshot()
    for name, total in expect.items():
        assert s["batch", name].items == {"samples": {"total": total, "calls": 50}}, name
    assert s["batch"].items == {"batches": {"total": 1, "calls": 1}}


def test_items_of_a_task_without_its_own_stage_go_to_the_stage_it_was_started_in(backend):
    async def child():
        instrument.add("bytes", 100)

    async def main():
        with instrument.stage("request"):
            await asyncio.create_task(child())

    asyncio.run(main())
    assert instrument.snapshot()["request"].items == {"bytes": {"total": 100, "calls": 1}}


def test_items_of_threads_are_kept_after_the_thread_ends(backend):
    def work(k):
        with instrument.stage("worker"):
            for _ in range(1000):
                instrument.add("tokens", k)
    ts = [threading.Thread(target=work, args=(k,)) for k in (1, 2, 3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    with instrument.stage("worker"):
        instrument.add("tokens", 4)
    assert instrument.snapshot()["worker"].items["tokens"] == {"total": 6004, "calls": 3001}


def test_floats_numpy_and_outside_any_stage(backend):
    with instrument.stage("io"):
        instrument.add("bytes", 1.5)
        instrument.add("bytes", np.int64(3))
        instrument.add("flops", np.float32(2.5))
        with instrument.stage("open-at-snapshot"):
            instrument.add("rows", 7)
            s = instrument.snapshot()
    instrument.add("orphans", 2)
    assert s["io"].items == {"bytes": {"total": 4.5, "calls": 2}, "flops": {"total": 2.5, "calls": 1}}
    assert s["io/open-at-snapshot"].calls == 0 and s["io/open-at-snapshot"].items["rows"]["total"] == 7
    assert instrument.snapshot().meta["items_outside_stages"] == {"orphans": {"total": 2, "calls": 1}}


@pytest.mark.parametrize("args, kwargs, exc, text", [
    ((3,), {}, TypeError, "item name must be a str, not int"),
    (("",), {}, ValueError, "item name must not be empty"),
    (("x" * 201,), {}, ValueError, "201 characters long; at most 200"),
    (("tokens", -1), {}, ValueError, "value must be >= 0"),
    (("tokens", float("nan")), {}, ValueError, "finite number"),
    (("tokens", "12"), {}, TypeError, "value must be a number of items (int or float), not str"),
    (("tokens", True), {}, TypeError, "not bool"),
    (("tokens",), {"count": 3}, TypeError, "unexpected keyword argument"),
    ((), {}, TypeError, "add()"),
])
def test_bad_input_is_refused_with_what_is_allowed(backend, args, kwargs, exc, text):
    with instrument.stage("s"):
        with pytest.raises(exc) as e:
            instrument.add(*args, **kwargs)
    assert text in str(e.value)
    assert not instrument.snapshot()["s"].items


def test_disabled_adds_nothing_and_many_names_fold_into_other(backend):
    instrument.configure(enabled=False)
    with instrument.stage("s"):
        instrument.add("tokens")
    instrument.configure(enabled=True)
    with pytest.warns(RuntimeWarning, match="distinct item names"):
        with instrument.stage("s"):
            for k in range(40):
                instrument.add(f"item{k}", 1)
    items = instrument.snapshot()["s"].items
    assert len(items) == 33 and items["(other)"] == {"total": 8, "calls": 8}
    assert sum(v["total"] for v in items.values()) == 40


WORKER = """
import sys, instrument
with instrument.stage("request"):
    with instrument.stage("forward"):
        for i in range(int(sys.argv[2])):
            instrument.add("tokens", i)
instrument.snapshot().save(sys.argv[1])
"""


def test_merge_of_two_processes_adds_items_exactly(tmp_path):
    files = []
    for n in (300, 500):
        f = tmp_path / f"p{n}.json"
        subprocess.run([sys.executable, "-c", WORKER, str(f), str(n)], check=True, env=env(), timeout=120)
        files.append(f)
    merged = Snapshot.load(files[0]).merge(Snapshot.load(files[1]))
    want = sum(range(300)) + sum(range(500))
    assert merged["request/forward"].items["tokens"] == {"total": want, "calls": 800}
    r = cli("merge", *files, "-o", tmp_path / "all.json")
    assert r.returncode == 0, r.stderr
    assert Snapshot.load(tmp_path / "all.json")["request/forward"].items["tokens"]["total"] == want


def test_since_subtracts_items(backend):
    with instrument.stage("s"):
        instrument.add("tokens", 10)
    a = instrument.snapshot()
    with instrument.stage("s"):
        instrument.add("tokens", 32)
        instrument.add("images", 2)
    w = instrument.snapshot().since(a)
    assert w["s"].calls == 1 and w["s"].items == {"tokens": {"total": 32, "calls": 1}, "images": {"total": 2, "calls": 1}}
