"""Stage ranges from the hot path, seen through the recording NVTX tool.

Written against the public API that lands with the hot path (instrument.configure,
instrument.stage, instrument.snapshot); skipped until it exists.
"""
import json
import textwrap
from collections import Counter

import pytest

instrument = pytest.importorskip("instrument")
if not all(hasattr(instrument, n) for n in ("stage", "configure", "snapshot")):
    pytest.skip("instrument.stage/configure/snapshot not merged yet", allow_module_level=True)

from nvtx_support import nvtx_include_dir, pushpop_paths, run_recorded, start_end_pairs  # noqa: E402

if nvtx_include_dir() is None:
    pytest.skip("NVTX headers (nvidia-nvtx) not installed", allow_module_level=True)

PRELUDE = textwrap.dedent("""
    import json, instrument
    instrument.configure(nvtx=True, nvtx_domain="instrument")
    def dump():
        print(json.dumps([list(s.path) for s in instrument.snapshot().stages]))
""")


def snapshot_paths(stdout):
    return {tuple(p) for p in json.loads(stdout.strip().splitlines()[-1])}


def test_push_pop_tree_equals_snapshot_tree():
    recs = run_recorded(PRELUDE + textwrap.dedent("""
        a = instrument.stage("a")
        for _ in range(3):
            with a:
                with instrument.stage("b"):
                    with instrument.stage("c"):
                        pass
                with instrument.stage("d"):
                    pass
        with instrument.stage("e"):
            pass
        dump()
    """))
    paths = pushpop_paths(recs, "instrument")  # balanced, or it raises
    assert set(paths) == snapshot_paths(recs.stdout) == {("a",), ("a", "b"), ("a", "b", "c"), ("a", "d"), ("e",)}
    assert Counter(paths)[("a", "b", "c")] == 3
    registered = Counter(r.message for r in recs if r.call == "nvtxDomainRegisterStringA" and r.domain == "instrument")
    assert registered["a"] == 1  # one registration per stage object, however many ranges
    assert [r.message for r in recs if r.call == "nvtxDomainCreateA"].count("instrument") >= 1


def test_threads_nest_independently():
    recs = run_recorded(PRELUDE + textwrap.dedent("""
        import threading
        def work(k):
            for _ in range(50):
                with instrument.stage("req"):
                    with instrument.stage(f"w{k % 2}"):
                        pass
        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in ts: t.start()
        for t in ts: t.join()
        dump()
    """))
    for tid in {r.tid for r in recs if r.is_push}:
        assert set(pushpop_paths([r for r in recs if r.tid == tid], "instrument")) <= snapshot_paths(recs.stdout)
    assert sum(1 for r in recs if r.is_push and r.message == "req") == 200


def test_asyncio_tasks_use_matched_start_end():
    recs = run_recorded(PRELUDE + textwrap.dedent("""
        import asyncio
        async def task(i):
            with instrument.stage("task"):
                await asyncio.sleep(0.001 * (i % 5))   # tasks interleave inside the stage
                await asyncio.sleep(0)
        async def main():
            await asyncio.gather(*(task(i) for i in range(50)))
        asyncio.run(main())
        dump()
    """))
    pairs = start_end_pairs(recs, "instrument")  # every id ends exactly once
    assert sum(1 for s, _ in pairs.values() if s.message == "task") == 50
    pushpop_paths(recs, "instrument")            # whatever was pushed is balanced too
    assert ("task",) in snapshot_paths(recs.stdout)


def test_styled_stage_colour_and_named_category():
    recs = run_recorded(PRELUDE + textwrap.dedent("""
        s = instrument.stage("styled", color=0x00FF00, category="io")
        assert instrument.stage("styled", color=0x00FF00, category="io") is s
        with s:
            pass
        with instrument.stage("plain"):
            pass
    """))
    pushes = {r.message: r for r in recs if r.call == "nvtxDomainRangePushEx"}
    named = [r for r in recs if r.call == "nvtxDomainNameCategoryA"]
    from instrument.live.nvtx import color_for
    assert pushes["styled"].color == 0xFF00FF00
    assert pushes["plain"].color == color_for("plain")
    assert [(r.category, r.message) for r in named] == [(pushes["styled"].category, "io")]
