"""Stages on the live side, both backends: nesting, threads, asyncio tasks, regions, errors, CPU time."""
import asyncio
import os
import random
import threading
import time
import warnings

import pytest

import instrument
from instrument.live import backend as live_backend, collector as _collector


def test_native_extension_is_built():
    from instrument import _native  # noqa: F401  (the build must produce it)
    assert live_backend.name == ("pure" if os.environ.get("INSTRUMENT_PURE_PYTHON") == "1" else "native")


def paths(snap):
    return {s.path: s for s in snap}


def test_nested_tree_and_self_time(backend):
    A, B = instrument.stage("a"), instrument.stage("b")
    for _ in range(10):
        with A:
            with B:
                time.sleep(0.002)
            with instrument.stage("c"):
                pass
    with B:
        pass
    snap = instrument.snapshot()
    p = paths(snap)
    assert set(p) == {("a",), ("a", "b"), ("a", "c"), ("b",)}
    assert p[("a",)].calls == 10 and p[("a", "b")].calls == 10 and p[("b",)].calls == 1
    a, ab, ac = p[("a",)], p[("a", "b")], p[("a", "c")]
    assert a.wall_self == a.wall_total - ab.wall_total - ac.wall_total
    assert ab.wall_min >= 2_000_000 and ab.wall_total >= 20_000_000
    assert a.wall_total >= ab.wall_total + ac.wall_total
    assert [s.path for s in snap.stages] == [("a",), ("a", "b"), ("a", "c"), ("b",)]


def test_recursion_builds_one_node_per_depth(backend):
    @instrument.region("fib")
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    assert fib(10) == 55
    p = paths(instrument.snapshot())
    # calls at depth d of the fib(10) recursion tree, counted independently
    def count(n, d, acc):
        acc[d] = acc.get(d, 0) + 1
        if n >= 2:
            count(n - 1, d + 1, acc)
            count(n - 2, d + 1, acc)
        return acc
    expect = count(10, 0, {})
    for d, c in expect.items():
        assert p[("fib",) * (d + 1)].calls == c


def test_sixteen_threads_exact_counts(backend):
    N, T = 2000, 16
    barrier = threading.Barrier(T)

    def work(k):
        barrier.wait()
        with instrument.stage("worker"):
            for _ in range(N):
                with instrument.stage("item"):
                    with instrument.stage(f"kind{k % 4}"):
                        pass

    ts = [threading.Thread(target=work, args=(k,)) for k in range(T)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    p = paths(instrument.snapshot())
    assert p[("worker",)].calls == T
    assert p[("worker", "item")].calls == T * N
    for k in range(4):
        assert p[("worker", "item", f"kind{k}")].calls == (T // 4) * N


def test_thread_started_inside_stage_does_not_inherit(backend):
    def child():
        with instrument.stage("in_thread"):
            pass
    with instrument.stage("outer"):
        t = threading.Thread(target=child)
        t.start()
        t.join()
    p = paths(instrument.snapshot())
    assert ("in_thread",) in p and ("outer", "in_thread") not in p


def test_context_passed_to_thread_nests(backend):
    import contextvars
    with instrument.stage("outer"):
        ctx = contextvars.copy_context()
        t = threading.Thread(target=ctx.run, args=(lambda: instrument.stage("in_thread").__enter__().__exit__(None, None, None),))
        t.start()
        t.join()
    assert ("outer", "in_thread") in paths(instrument.snapshot())


def test_asyncio_500_interleaving_tasks(backend):
    seen = []

    async def task(i):
        with instrument.stage("task"):
            await asyncio.sleep(random.random() * 0.01)
            with instrument.stage("inner"):
                await asyncio.sleep(random.random() * 0.01)
                seen.append(_collector.backend.current_path())
            await asyncio.sleep(0)

    async def main():
        with instrument.stage("request"):
            await asyncio.gather(*(task(i) for i in range(500)))

    random.seed(1)
    asyncio.run(main())
    assert seen == [("request", "task", "inner")] * 500
    snap = instrument.snapshot()
    p = paths(snap)
    assert set(p) == {("request",), ("request", "task"), ("request", "task", "inner")}
    assert p[("request", "task")].calls == 500 and p[("request", "task", "inner")].calls == 500
    assert p[("request",)].calls == 1
    assert snap.meta["exits"] == {"unmatched_exits": 0, "out_of_order_exits": 0, "cross_thread_exits": 0}


def test_exceptions_propagate_unchanged_and_are_counted(backend):
    class Boom(Exception):
        pass

    err = Boom("x")
    for i in range(5):
        with pytest.raises(Boom) as ei:
            with instrument.stage("s"):
                if i % 2 == 0:
                    raise err
                raise Boom(i)
        if i % 2 == 0:
            assert ei.value is err

    @instrument.region
    def bad():
        raise KeyError("k")

    with pytest.raises(KeyError):
        bad()
    p = paths(instrument.snapshot())
    assert p[("s",)].calls == 5 and p[("s",)].errors == 5
    assert p[("test_exceptions_propagate_unchanged_and_are_counted.<locals>.bad",)].errors == 1


def test_region_forms(backend):
    class Model:
        @instrument.region
        def forward(self, x):
            """doc"""
            return x * 2

        @instrument.region("step")
        def step(self, x):
            return self.forward(x) + 1

    m = Model()
    assert m.step(2) == 5 and Model.forward(m, 1) == 2
    assert Model.forward.__doc__ == "doc" and Model.forward.__name__ == "forward"

    @instrument.region(name="kw")
    def kw(a, *, b=1):
        return a + b

    assert kw(1, b=2) == 3

    @instrument.region("agen_ok")
    async def coro(x):
        await asyncio.sleep(0)
        return x

    assert asyncio.run(coro(3)) == 3

    with pytest.raises(TypeError, match="async generator"):
        @instrument.region
        async def agen():
            yield 1

    p = paths(instrument.snapshot())
    fwd = Model.forward.__qualname__
    assert fwd.endswith("<locals>.Model.forward")
    assert p[("step",)].calls == 1 and p[("step", fwd)].calls == 1
    assert p[(fwd,)].calls == 1 and p[("kw",)].calls == 1 and p[("agen_ok",)].calls == 1


def test_stage_as_a_decorator_records_each_call_like_region(backend):
    @instrument.stage("handler")
    def handler(x):
        """doc"""
        time.sleep(0.002)
        return x + 1

    @instrument.stage("async handler", color=0x00FF00)
    async def ahandler(x):
        await asyncio.sleep(0.002)
        return x * 2

    assert [handler(i) for i in range(3)] == [1, 2, 3] and handler.__doc__ == "doc"
    assert asyncio.run(ahandler(4)) == 8 and asyncio.run(ahandler(5)) == 10
    assert handler.stage is instrument.stage("handler")
    with pytest.raises(TypeError, match="decorates a function"):
        instrument.stage("x")(42)
    with pytest.raises(TypeError, match="takes the function alone"):
        instrument.stage("x")(handler, 1)
    p = paths(instrument.snapshot())
    assert p[("handler",)].calls == 3 and p[("handler",)].wall_total >= 3 * 2_000_000
    assert p[("async handler",)].calls == 2 and p[("async handler",)].wall_min >= 2_000_000


def test_region_on_generator_times_each_resumption(backend):
    @instrument.region("gen")
    def gen(n):
        for i in range(n):
            time.sleep(0.001)
            yield i

    with instrument.stage("consumer"):
        out = []
        for x in gen(4):
            with instrument.stage("use"):
                time.sleep(0.003)
            out.append(x)
    assert out == [0, 1, 2, 3]
    p = paths(instrument.snapshot())
    # four items plus the final StopIteration resumption; the consumer's own stage never nests under gen
    assert p[("consumer", "gen")].calls == 5
    assert ("consumer", "use") in p and ("consumer", "gen", "use") not in p
    # the resumptions and the consumer's work are disjoint spans of the consumer's call, by the same clock,
    # however long the machine made each sleep: gen timed as one span would overlap use and overflow consumer
    assert p[("consumer", "gen")].wall_total + p[("consumer", "use")].wall_total <= p[("consumer",)].wall_total


def test_bad_names_rejected_at_call_site(backend):
    for bad, exc, msg in [(3, TypeError, "must be a str"), (None, TypeError, "must be a str"),
                          ("", ValueError, "must not be empty"), ("x" * 1025, ValueError, "at most 1024"),
                          (["a"], TypeError, "must be a str")]:
        with pytest.raises(exc, match=msg):
            instrument.stage(bad)
        if bad is not None:   # region() with no name is @region() and takes the function's name
            with pytest.raises(exc, match=msg):
                instrument.region(bad)
    assert instrument.stage("x" * 1024).name == "x" * 1024


def test_out_of_order_exit_closes_the_inner_stages_and_keeps_the_numbers_consistent(backend):
    """Exiting `a` while `b` (inside it) is open closes `b` with it: b's calls are recorded, b never takes longer
    than a, b's own exit later is expected and ignored (not an unmatched exit), and the misuse is counted once per
    exit in meta and warned about once."""
    a, b = instrument.stage("a"), instrument.stage("b")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        around_a = 0
        for _ in range(3):
            t = time.perf_counter_ns()
            a.__enter__()
            b.__enter__()
            time.sleep(0.001)
            a.__exit__(None, None, None)   # b still open: closed with a
            around_a += time.perf_counter_ns() - t
            time.sleep(0.005)              # b's own exit comes later: none of this is b's
            b.__exit__(None, None, None)
    snap = instrument.snapshot()
    p = paths(snap)
    assert p[("a",)].calls == 3 and p[("a", "b")].calls == 3
    # within the test's own clock around each a, so nothing after a's exit (b's late exit) counts
    assert p[("a", "b")].wall_total <= p[("a",)].wall_total <= around_a
    assert p[("a", "b")].wall_max <= p[("a",)].wall_max
    assert snap.meta["exits"] == {"unmatched_exits": 0, "out_of_order_exits": 3, "cross_thread_exits": 0}
    assert sum("exited while an inner stage" in str(x.message) for x in w) <= 1
    assert not [x for x in w if "exited on a different thread" in str(x.message)]
    with a:   # the stack is clean afterwards: nesting works as before
        with b:
            pass
    assert paths(instrument.snapshot())[("a", "b")].calls == 4


def test_exit_in_another_task_is_reported_not_crashing(backend):
    s = instrument.stage("leaky")

    async def opener():
        s.__enter__()

    async def closer():
        s.__exit__(None, None, None)

    async def main():
        await asyncio.create_task(opener())
        await asyncio.create_task(closer())

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        asyncio.run(main())
    snap = instrument.snapshot()
    assert snap.meta["exits"]["unmatched_exits"] == 1
    assert any("different thread or task" in str(x.message) for x in w)
    with instrument.stage("after"):
        pass
    assert ("after",) in paths(instrument.snapshot())


def test_disabled_is_a_noop(backend):
    instrument.configure(enabled=False)
    with instrument.stage("x"):
        pass

    @instrument.region
    def f():
        return 1
    assert f() == 1
    assert len(instrument.snapshot()) == 0
    instrument.configure(enabled=True)
    with instrument.stage("x"):
        pass
    assert paths(instrument.snapshot())[("x",)].calls == 1


def test_cpu_time_tracks_spinning_not_sleeping(backend):
    with instrument.stage("spin"):
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 50_000_000:
            pass
        spent = time.thread_time_ns() - t0
    with instrument.stage("sleep"):
        time.sleep(0.05)
    p = paths(instrument.snapshot())
    # the thread's own CPU clock read inside the stage is the independent truth; task-clock may add the
    # VM's steal time to it, never more than the stage's wall time
    assert spent * 0.95 <= p[("spin",)].cpu_total <= p[("spin",)].wall_total + 1_000_000   # + the clock reads
    assert p[("sleep",)].cpu_total < 5_000_000 and p[("sleep",)].wall_total >= 50_000_000


def test_both_backends_agree():
    from conftest import BACKENDS
    if BACKENDS["native"] is None:
        pytest.skip("C extension not built")
    results = []
    for mod in (BACKENDS["native"], BACKENDS["pure"]):
        old = _collector.backend
        _collector.use_backend(mod)
        try:
            instrument.reset()

            @instrument.region("leaf")
            def leaf(i):
                if i % 7 == 0:
                    raise ValueError(i)

            with instrument.stage("root"):
                for i in range(100):
                    with instrument.stage("mid"):
                        try:
                            leaf(i)
                        except ValueError:
                            pass
            s = instrument.snapshot()
            results.append({x.path: (x.calls, x.errors, sum(x.hist.values())) for x in s})
        finally:
            _collector.use_backend(old)
    assert results[0] == results[1]
    assert results[0][("root", "mid", "leaf")] == (100, 15, 100)
