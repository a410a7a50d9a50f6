"""The root-exit hook of both backends: called once per outermost stage exit, after the
call is recorded, never for nested stages; it cannot break the caller."""
import asyncio
import threading

import pytest

import instrument
from instrument.live import collector as _collector


@pytest.fixture
def hooked(backend):
    seen = []

    def hook():
        raw = backend.collect()   # the call that just ended is already recorded
        seen.append(sum(s["calls"] for s in raw["stats"] if s["node"] == root_node(raw)))
    backend.set_root_exit_hook(hook)
    yield backend, seen
    backend.set_root_exit_hook(None)


def root_node(raw):
    return next((nid for nid, parent, name, _ in raw["nodes"] if name == "request" and parent == 0), None)


def test_once_per_outermost_exit_after_it_is_recorded(hooked):
    backend, seen = hooked
    for _ in range(3):
        with instrument.stage("request"):
            with instrument.stage("inner"):
                with instrument.stage("deeper"):
                    pass
            with instrument.stage("inner"):
                pass
    assert seen == [1, 2, 3]


def test_regions_threads_and_tasks(hooked):
    backend, seen = hooked

    @instrument.region("request")
    def handle(fail):
        if fail:
            raise ValueError("kept")

    handle(False)
    with pytest.raises(ValueError, match="kept"):   # the function's exception passes through unchanged
        handle(True)
    ts = [threading.Thread(target=handle, args=(False,)) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

    async def task():
        with instrument.stage("request"):
            await asyncio.sleep(0)

    async def both():
        await asyncio.gather(task(), task())
    asyncio.run(both())
    assert len(seen) == 2 + 4 + 2 and sorted(seen) == list(range(1, 9))
    assert instrument.snapshot()["request"].errors == 1


def test_a_failing_hook_is_an_internal_failure_not_an_exception(backend):
    def bad():
        raise RuntimeError("hook broke")
    backend.set_root_exit_hook(bad)
    try:
        with pytest.warns(RuntimeWarning, match="internal failure in root exit hook"):
            with instrument.stage("request"):
                pass
        with pytest.raises(KeyError):       # the stage's own exception wins over nothing
            with instrument.stage("request"):
                raise KeyError("mine")
    finally:
        backend.set_root_exit_hook(None)
    s = instrument.snapshot()
    assert s["request"].calls == 2 and s.meta["internal_failures"] >= 2


def test_set_root_exit_hook_refuses_what_is_not_callable(backend):
    with pytest.raises(TypeError, match="needs a callable or None"):
        backend.set_root_exit_hook(42)


def test_collector_keeps_the_hook_across_backend_switches(backend):
    from conftest import BACKENDS
    calls = []
    _collector.on_root_exit(lambda: calls.append(1))
    try:
        other = BACKENDS["pure"] if backend is BACKENDS["native"] else BACKENDS["native"]
        if other is None:
            pytest.skip("C extension not built")
        _collector.use_backend(other)
        with instrument.stage("request"):
            pass
        _collector.use_backend(backend)
        with instrument.stage("request"):
            pass
    finally:
        _collector.on_root_exit(None)
    with instrument.stage("request"):
        pass
    assert calls == [1, 1]
