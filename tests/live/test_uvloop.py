"""asyncio attribution on uvloop, which runs task steps in its own C code past asyncio.events.Handle: each task's
coroutine, wrapped where uvloop.Loop makes a task of it, times its own steps.  Checked against what each task
measures itself (thread_time_ns around its own spins); a loop no hook reaches is named, with what to do."""
import asyncio
import gc
import subprocess
import sys
import time

import pytest

import instrument
from instrument.live import tasks as live_tasks
from conftest import spin_ns

uvloop = pytest.importorskip("uvloop")
pytestmark = pytest.mark.native_only   # what only the C core records (conftest.py)


def spinning_tasks(n):
    """n tasks, each in its own stage, spinning 2 ms + 2 ms around an await; returns (main, what each measured)."""
    truth, own = {}, {}

    async def job(i):
        t0 = time.thread_time_ns()
        with instrument.stage(f"job{i}"):
            c = spin_ns(2_000_000)
            with instrument.stage("wait"):
                t1 = time.thread_time_ns()
                await asyncio.sleep(0.001)
                t2 = time.thread_time_ns()
            c += spin_ns(2_000_000)
        truth[i] = c
        own[i] = (t1 - t0) + (time.thread_time_ns() - t2)   # the task's own CPU in its two steps, stages' cost too

    async def main():
        await asyncio.gather(*(job(i) for i in range(n)))
        return instrument.snapshot()

    main.own = own
    return main, truth


def test_under_uvloop_run_each_task_is_charged_its_own_spins(backend):
    main, truth = spinning_tasks(25)
    gc.disable()   # a collection is CPU of whichever stage runs then (0.4 ms in a `wait` step, late in the suite)
    try:
        snap = uvloop.run(main())
    finally:
        gc.enable()
    assert len(truth) == 25
    for i, mine in truth.items():
        s, w = snap[f"job{i}"], snap[f"job{i}/wait"]
        assert s.calls == 1 and s.overlapped_calls == 0 and w.overlapped_calls == 0, (i, s.overlapped_calls)
        # 13x its own spins if the other tasks' bursts during its await were charged to it; within 10 % of them on
        # a quiet machine, and never more than the task's own CPU in its steps (measured around them) and 10 %
        mine_all = main.own[i]
        assert 0.9 * mine <= s.cpu_total <= max(mine, mine_all) + 0.10 * mine, (i, s.cpu_total, mine, mine_all,
                                                                              s.cpu_sys_total, s.runqueue)
        assert w.cpu_total < 0.10 * mine, (i, w.cpu_total, mine)
    tasks = snap.meta["tasks"]
    assert tasks["attribution"] == "per task" and tasks["mechanism"] == live_tasks.MECHANISM_UVLOOP, tasks
    assert tasks["overlapped_calls"] == 0 and tasks["steps"] >= 25 * 2


def test_a_task_factory_of_the_users_is_chained_to(backend):
    made = []

    def factory(loop, coro, **kw):
        made.append(coro)
        return asyncio.Task(coro, loop=loop, **kw)

    main, truth = spinning_tasks(5)

    async def outer():
        asyncio.get_running_loop().set_task_factory(factory)
        return await asyncio.create_task(main())

    t0 = time.thread_time_ns()
    snap = uvloop.run(outer())
    spare = time.thread_time_ns() - t0 - sum(truth.values())   # the thread CPU the tasks did not measure themselves
    # main and the 5 jobs reach the user's factory wrapped (uvloop's own Cython coroutines at shutdown as they are)
    wrapped = [c for c in made if type(c).__name__ == "_Stepped"]
    assert len(wrapped) == 6 and all(asyncio.iscoroutine(c) for c in wrapped), made
    for i, mine in truth.items():
        s = snap[f"job{i}"]
        # its own spins, give or take the loop's and the SDK's work inside the stage (not the other tasks' spins)
        assert s.overlapped_calls == 0 and 0.9 * mine <= s.cpu_total <= mine + max(0.1 * mine, spare), \
            (i, s.cpu_total, mine, spare)


def test_the_wrapped_coroutine_reads_as_the_coroutine(backend):
    async def named():
        await asyncio.sleep(0)
        return 7

    async def main():
        t = asyncio.get_running_loop().create_task(named())
        coro = t.get_coro()
        assert coro.__qualname__.endswith("named") and coro.cr_code is named.__code__
        assert "named" in repr(t)
        assert await t == 7
        with pytest.raises(ZeroDivisionError):
            await asyncio.get_running_loop().create_task(boom())
        c = asyncio.get_running_loop().create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        c.cancel()
        with pytest.raises(asyncio.CancelledError):
            await c

    async def boom():
        await asyncio.sleep(0)
        return 1 / 0

    uvloop.run(main())


def test_a_loop_no_hook_reaches_is_named_with_what_to_do(backend):
    """uvloop's own base class, made directly, is not uvloop.Loop: nothing wraps its tasks; its overlapping calls
    are marked, never summed, and meta and doctor name the loop and what to do."""
    from instrument.live import doctor

    async def job():
        with instrument.stage("job"):
            spin_ns(200_000)
            await asyncio.sleep(0.001)

    async def main():
        await asyncio.gather(*(job() for _ in range(5)))
        return instrument.snapshot(), doctor.format_text(doctor.collect([]))

    loop = uvloop.loop.Loop()
    try:
        snap, text = loop.run_until_complete(main())
    finally:
        loop.close()
    tasks = snap.meta["tasks"]
    assert tasks["attribution"] == "overlapped calls marked" and "uvloop.loop.Loop" in tasks["reason"], tasks
    assert "uvloop.new_event_loop" in tasks["reason"] and "uvloop.loop.Loop" in text, text
    from instrument.exporters import table
    assert "uvloop.loop.Loop" in table.render([snap]).replace("\n", " ")
    j = snap["job"]
    assert j.calls == 5 and j.overlapped_calls >= 4, (j.calls, j.overlapped_calls)
    assert j.cpu_calls <= j.calls - j.overlapped_calls, "an overlapped call's CPU time is left out"
    assert instrument.snapshot().meta["tasks"]["attribution"] == "per task", "no loop runs now"


def test_turned_off_the_uvloop_hook_is_removed_and_back_on_it_returns(backend):
    assert "create_task" in uvloop.Loop.__dict__
    instrument.configure(task_attribution=False)
    assert "create_task" not in uvloop.Loop.__dict__
    instrument.configure(task_attribution=True)
    assert "create_task" in uvloop.Loop.__dict__


@pytest.mark.parametrize("first", ["instrument", "uvloop"])
def test_hooked_whichever_is_imported_first(first):
    code = (f"import {first}; import {'uvloop' if first == 'instrument' else 'instrument'}; import uvloop; "
            "print('create_task' in uvloop.Loop.__dict__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["True"], out
