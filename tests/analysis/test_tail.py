"""The tail view from known exemplars: slow calls against a typical one, stage by stage."""
import pytest

import instrument

from instrument.analysis.tail import tail, tail_of
from instrument.snapshot import Snapshot
from snapfactory import snap, st

MS = 1_000_000


def call(seq, pre, fwd, own=0, slow=False, sample=True):
    parts = [("request",), ("request", "pre"), ("request", "forward")]
    ns = [own, pre, fwd]
    return {"path": ["request"], "wall_ns": own + pre + fwd, "start_ns": seq, "pid": 1, "tid": 1, "seq": seq,
            "slow": slow, "sample": sample, "breakdown": [{"path": list(p), "wall_ns": v} for p, v in zip(parts, ns)]}


def service(exemplars, walls):
    s = snap(st("request", 0, 0, values=walls), st("request/pre", 0, 0, values=[1] * len(walls)),
             st("request/forward", 0, 0, values=[1] * len(walls)))
    return Snapshot(s.stages, s.meta, None, exemplars)


def test_excess_and_shares_of_known_calls():
    # 98 typical requests of 1 ms (0.1 pre + 0.9 forward), 2 slow ones: pre 10 ms, and forward 3 ms
    walls = [1 * MS] * 98 + [10.9 * MS, 3.1 * MS]
    typical = [call(k, MS // 10, 9 * MS // 10) for k in range(8)]
    slow = [call(100, 10 * MS, 9 * MS // 10, slow=True, sample=False),
            call(101, MS // 10, 3 * MS, slow=True, sample=False)]
    v = tail_of(service(typical + slow, walls), "request", quantile=0.98)
    assert v.slow_calls == 2 and v.typical_calls == 4 and v.calls == 100
    assert v.slow_mean_ns == pytest.approx(7 * MS) and v.typical_mean_ns == pytest.approx(1 * MS)
    pre, fwd, own = v.excess
    assert pre.path == ("request", "pre") and pre.ns == pytest.approx(4.95 * MS) and pre.share == pytest.approx(0.825)
    assert fwd.path == ("request", "forward") and fwd.share == pytest.approx(1.05 / 6)
    assert own.ns == 0 and own.share == 0
    assert v.share(("request",)) == pytest.approx(1.0) and v.share(("request", "pre")) == pytest.approx(0.825)
    d = v.to_dict()
    assert d["stage"] == ["request"] and d["excess"][0] == {"path": ["request", "pre"], "ns": pre.ns,
                                                            "share": pre.share, "slow_ns": pre.slow_ns,
                                                            "typical_ns": pre.typical_ns,
                                                            # no split kept with these calls: all of it unknown
                                                            "parts_ns": {"unknown": pre.ns}, "component": "unknown",
                                                            # no memory measured with them either
                                                            "slow_mem_peak_bytes": None,
                                                            "typical_mem_peak_bytes": None}
    assert set(d) >= {"stage", "p50_ns", "p99_ns", "slow_calls", "excess"}


def test_quantile_chooses_the_slow_calls_and_bad_quantiles_are_refused():
    walls = [1 * MS] * 90 + [2 * MS] * 9 + [20 * MS]
    ex = [call(k, 0, MS) for k in range(8)] + [call(50 + k, MS, MS, slow=True, sample=False) for k in range(9)] \
        + [call(99, 19 * MS, MS, slow=True, sample=False)]
    s = service(ex, walls)
    assert tail_of(s, "request", 0.99).slow_calls == 1
    assert tail_of(s, "request", 0.9).slow_calls == 10
    with pytest.raises(ValueError, match="quantile must be between 0 and 1"):
        tail_of(s, "request", 1.0)


def test_no_exemplars_no_view():
    assert tail(snap(st("request", 10, MS))) == []
    assert tail_of(snap(st("request", 10, MS)), "request") is None


@pytest.mark.native_only   # the tail view reads exemplars: the C core keeps them
def test_a_tail_made_by_a_busy_loop_says_so_in_one_sentence(backend):
    """Requests await a 10 ms sleep inside stage io; early on, two bursts of 40 ms CPU work run on the loop in stage
    burst.  The slow requests are the ones that waited for the loop: the tail's excess is io's, its component
    loop_ready, within what each request measured of itself beyond its sleep, and the sentence names burst."""
    import asyncio
    import time
    instrument.configure(exemplars=16)
    waited = {}

    async def request(i):
        with instrument.stage("request"):
            with instrument.stage("io"):
                t = time.perf_counter_ns()
                await asyncio.sleep(0.01)
                waited[i] = time.perf_counter_ns() - t - 10_000_000   # beyond the sleep: ready, not run

    async def burst():
        with instrument.stage("burst"):
            t = time.thread_time_ns()
            while time.thread_time_ns() - t < 40_000_000:
                pass

    async def main():
        await asyncio.gather(*(request(i) for i in range(8)), burst(), burst())
        for k in range(1, 16):
            await asyncio.gather(*(request(8 * k + i) for i in range(4)))

    asyncio.run(main())
    snap = instrument.snapshot()
    view = tail_of(snap, "request")
    top = view.excess[0]
    assert top.path == ("request", "io") and top.component == "loop_ready", view.to_dict()
    slow = sorted(waited.values())[-view.slow_calls:]     # the slowest requests' own wait beyond the sleep
    typical = sorted(waited.values())[len(waited) // 4: -len(waited) // 4]
    truth = sum(slow) / len(slow) - sum(typical) / len(typical)
    assert top.parts["loop_ready"] == pytest.approx(truth, rel=0.25), (top.parts, truth)
    why = view.sentence(snap)
    assert "request/io waiting for the event loop" in why and "burst" in why, why
