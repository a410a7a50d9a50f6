"""The C hot path's paths, exercised for `valgrind --tool=memcheck` (see .ci/run)."""
import asyncio
import logging
import threading
import warnings

import instrument

warnings.simplefilter("ignore")
logging.getLogger("asyncio").disabled = True   # tasks destroyed while pending, on purpose
instrument.configure(counters=["task-clock", "page-faults"], trace_events=64, max_stages=40)


@instrument.region("leaf")
def leaf(i):
    if i % 5 == 0:
        raise ValueError(i)
    return i


def work(k):
    for i in range(200):
        with instrument.stage("req"):
            instrument.add("requests")
            with instrument.stage(f"kind{k % 3}"):
                instrument.add("tokens", i)
                instrument.add(f"item{i % 40}", 1.5)   # past 32 names: "(other)"
                try:
                    leaf(i)
                except ValueError:
                    pass


ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()


async def task(i):
    with instrument.stage("task"):
        instrument.add("samples", i)
        await asyncio.sleep(0)
        with instrument.stage("inner"):
            await asyncio.sleep(0)


async def main():
    await asyncio.gather(*(task(i) for i in range(50)))

asyncio.run(main())


# asyncio attribution (csrc/tasks.c): a loop inside a stage, cancelled and never-finishing tasks, the fallback
async def hang():
    with instrument.stage("hang"):
        await asyncio.Event().wait()


async def doomed():
    with instrument.stage("doomed"):
        await asyncio.sleep(10)


async def main2():
    with instrument.stage("main2"):
        hs = [asyncio.ensure_future(hang()) for _ in range(5)]
        ds = [asyncio.ensure_future(doomed()) for _ in range(5)]
        await asyncio.gather(*(task(i) for i in range(20)))
        for d in ds:
            d.cancel()
        await asyncio.gather(*ds, return_exceptions=True)
        del hs

loop = asyncio.new_event_loop()
with instrument.stage("loop"):
    loop.run_until_complete(main2())
loop.close()
del loop
import gc  # noqa: E402
gc.collect()
try:   # the coroutine wrapper on uvloop (csrc/steps.c): steps, cancelled and never-finishing tasks
    import uvloop  # noqa: E402
except ImportError:
    uvloop = None
if uvloop is not None:
    async def main3():
        with instrument.stage("uv"):
            hs = [asyncio.ensure_future(hang()) for _ in range(3)]
            ds = [asyncio.ensure_future(doomed()) for _ in range(3)]
            await asyncio.gather(*(task(i) for i in range(10)))
            for d in ds:
                d.cancel()
            await asyncio.gather(*ds, return_exceptions=True)
            del hs
    uvloop.run(main3())
    gc.collect()
instrument.configure(task_attribution=False)
asyncio.run(main())
instrument.configure(task_attribution=True)
a, b = instrument.stage("a"), instrument.stage("b")
a.__enter__(); b.__enter__(); a.__exit__(None, None, None); b.__exit__(None, None, None)
b.__exit__(None, None, None)
for i in range(100):
    with instrument.stage(f"n{i}"):
        pass
snap = instrument.snapshot()
assert snap["req"].calls == 800 and snap["task"].calls == 100 and snap["loop/main2/task"].calls == 20
assert snap["loop/main2/hang"].abandoned_calls == 5 and snap["loop/main2/doomed"].errors == 5
assert snap["req"].items["requests"]["total"] == 800 and snap.exemplars
instrument.configure(exemplars=2)      # the stores are dropped and rebuilt with K = 2
for i in range(50):
    with instrument.stage("req"):
        with instrument.stage("kind0"):
            pass
instrument.add("outside")
assert sum(e["slow"] for e in instrument.snapshot().exemplars if e["path"] == ["req"]) == 2
instrument.reset()
with instrument.stage("after_reset"):
    pass

from instrument.live import backend as _backend  # noqa: E402
seen = []


def hook():
    seen.append(1)
    if len(seen) == 3:
        _backend.current.set_root_exit_hook(lambda: 1 / 0)   # replaced while it runs, by one that fails


_backend.current.set_root_exit_hook(hook)
for i in range(5):
    with instrument.stage("root"):
        with instrument.stage("child"):
            pass
_backend.current.set_root_exit_hook(None)
assert len(seen) == 3 and instrument.snapshot()["root"].calls == 5
# memory: the resident set and a callable source, nested, a reset seen from inside, failing sources (a gauge of
# its own, not tracemalloc: tracemalloc's traceback records read as leaks under memcheck whoever allocates them)
gauge = {"cur": 0, "peak": 0}
_native = _backend.current


def alloc(n):
    gauge["cur"] += n
    gauge["peak"] = max(gauge["peak"], gauge["cur"])


_native.configure(memory=["host", ("heap", lambda: (gauge["cur"], gauge["peak"]),
                                   lambda: gauge.update(peak=gauge["cur"]))])
for i in range(20):
    with instrument.stage("mem"):
        alloc(1000)
        with instrument.stage("inner"):
            alloc(10)
            _native.memory_reset_seen(["heap"])
            gauge["peak"] = gauge["cur"]
            alloc(-10)
        alloc(-1000)
_native.configure(memory=["host", ("bad", lambda: 1 / 0, None), ("odd", lambda: (1,), None)])
for i in range(5):
    with instrument.stage("mem2"):
        pass
assert [s["error"] is not None for s in _native.memory_status() if s["name"] in ("bad", "odd")] == [True, True]
# calls past the first 8 are read by chance and weighted 1 / chance: a mean of equal peaks may round by an ulp
assert abs(instrument.snapshot()["mem"].memory_of("heap")["peak_mean"] - 1010) < 1e-9
instrument.configure(memory="host")
print(len(instrument.snapshot()), "stages ok")
