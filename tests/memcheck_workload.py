"""The C hot path's paths, exercised for `valgrind --tool=memcheck` (see .ci/run)."""
import asyncio
import threading
import warnings

import instrument

warnings.simplefilter("ignore")
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
a, b = instrument.stage("a"), instrument.stage("b")
a.__enter__(); b.__enter__(); a.__exit__(None, None, None); b.__exit__(None, None, None)
b.__exit__(None, None, None)
for i in range(100):
    with instrument.stage(f"n{i}"):
        pass
snap = instrument.snapshot()
assert snap["req"].calls == 800 and snap["task"].calls == 50
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
print(len(instrument.snapshot()), "stages ok")
