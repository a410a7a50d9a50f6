"""docs/schema.md and the file the snapshot writes cannot drift apart: a real recording (nesting, threads, items,
software counters, exemplars, trace events, asyncio, the cardinality cap), its window, fold and merge write
exactly the fields the document describes."""
import os
import re
import subprocess
import sys

import pytest

from instrument.snapshot import Snapshot, merge_all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = {"Top level": "", "`meta`": "meta.", "`stages[]`": "stages[].", "`exemplars[]`": "exemplars[].",
            "`events[]`": "events[]."}

# described, but not written by a recording without torch, CUDA or torch.distributed
NOT_RECORDED_HERE = {"meta.gpu", "meta.torch_profiler", "meta.distributed", "stages[].gpu", "stages[].ops"}

WORK = r"""
import asyncio, sys, threading, time
import instrument

instrument.configure(counters="task-clock,page-faults,context-switches", trace_events=1000, max_stages=12)

def spin(ns):
    t = time.thread_time_ns()
    while time.thread_time_ns() - t < ns:
        pass

def request():
    with instrument.stage("request"):
        with instrument.stage("tokenize"):
            spin(200_000)
            instrument.add("tokens", 7)
        with instrument.stage("model"):
            with instrument.stage("forward"):
                spin(300_000)
            time.sleep(0.001)

for _ in range(20):
    request()
instrument.snapshot().save(sys.argv[1] + "/early.json")
t = threading.Thread(target=lambda: [request() for _ in range(10)])
t.start(); t.join()
instrument.add("outside", 1)

async def handler():
    with instrument.stage("handler"):
        await asyncio.sleep(0.002)
        spin(100_000)

async def hang():
    instrument.stage("hang").__enter__()    # the task is destroyed while pending: an abandoned call
    await asyncio.Event().wait()

async def main():
    hangs = [asyncio.ensure_future(hang())]
    await asyncio.gather(*[handler() for _ in range(4)], asyncio.sleep(0.001))
    spin(3_000_000)                         # the handlers wait for the loop meanwhile
    await asyncio.sleep(0.005)

import logging
logging.getLogger("asyncio").disabled = True
loop = asyncio.new_event_loop()
loop.run_until_complete(main())
loop.close()
del loop
import gc; gc.collect()
for k in range(14):                          # more names than max_stages: an (other) node
    with instrument.stage(f"name{k}"):
        pass
instrument.snapshot().save(sys.argv[1] + "/later.json")

instrument.configure(task_attribution=False)  # overlapping calls without a hook: marked, not summed
async def job():
    with instrument.stage("job"):
        await asyncio.sleep(0.001)
async def jobs():
    await asyncio.gather(job(), job())
asyncio.run(jobs())
instrument.snapshot().save(sys.argv[1] + "/unhooked.json")
"""


def documented():
    """Every field docs/schema.md describes, as a dotted path from the top of the file (`stages[].wall_ns.total`)."""
    out, prefix = set(), None
    for line in open(os.path.join(ROOT, "docs", "schema.md"), encoding="utf-8"):
        if line.startswith("## "):
            title = line[3:].strip()
            prefix = next((p for t, p in SECTIONS.items() if title.startswith(t)), None)
            continue
        if prefix is None or not line.startswith("| `"):
            continue
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            head, *alts = name.split("/")
            base = head.rpartition(".")[0]
            out.add(prefix + head)
            out.update(prefix + (f"{base}.{a}" if base else a) for a in alts)
    return out


def written(obj, doc, prefix=""):
    """The dotted paths of a snapshot dict, down into an object (or a list of objects) wherever the document
    describes its keys."""
    out = set()
    for k, v in obj.items():
        name = prefix + k
        out.add(name)
        if isinstance(v, dict) and any(d.startswith(name + ".") for d in doc):
            out |= written(v, doc, name + ".")
        elif isinstance(v, list) and any(d.startswith(name + "[].") for d in doc):
            for x in v:
                out |= written(x, doc, name + "[].")
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    d = tmp_path_factory.mktemp("schema")
    r = subprocess.run([sys.executable, "-c", WORK, str(d)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {name: Snapshot.load(d / f"{name}.json") for name in ("early", "later", "unhooked")}


def test_the_schema_document_parses_as_dotted_fields():
    doc = documented()
    assert {"meta.pid", "meta.overhead.wall_bias_ns", "stages[].wall_ns.p999", "stages[].wall_split_ns.unknown",
            "exemplars[].breakdown[].split", "events[].tdur_ns", "version", "meta.exits.cross_thread_exits"} <= doc
    assert written({"a": {"b": 1, "c": {"d": 2}}, "l": [{"x": 1}], "f": {"k": 1}}, {"a.b", "a.c", "l[].x", "f"}) == \
        {"a", "a.b", "a.c", "l", "l[].x", "f"}


def test_every_field_written_is_documented_and_every_documented_field_is_written(recorded):
    later, early, unhooked = recorded["later"], recorded["early"], recorded["unhooked"]
    ranked = [Snapshot(later.stages, dict(later.meta, distributed={"rank": r, "world_size": 2}), later.events,
                       later.exemplars) for r in (0, 1)]
    snaps = [later, unhooked, later.since(early), later.fold(), merge_all(ranked)]
    assert later.exemplars and later.events and any(s.other for s in later) and later["hang"].abandoned_calls
    doc = documented()
    found = set().union(*(written(s.to_dict(), doc) for s in snaps))
    parents = {re.sub(r"(\[\])?\.[^.]+$", "", d) for d in doc if "." in d}   # `meta.exits` of `meta.exits.x`
    assert found - doc - parents == set(), "written but not in docs/schema.md"
    assert doc - found == NOT_RECORDED_HERE, "in docs/schema.md but never written here"
