"""Wall time is exact on every call in every configuration, preempted threads included.

A thread that shares its core with a busy process is preempted where the scheduler
finds its slice used up, and reading the thread's CPU clock (a system call on a VM)
is such a place: a reading taken outside the call's wall window would drop that
time from the call.  The test pins itself and a CPU hog to one core and times each
call itself; the SDK's wall time may only leave out its own enter/exit work."""
import time

import pytest

import instrument


@pytest.mark.parametrize("counters", ["default", "none"])
@pytest.mark.parametrize("cpu_clock", [True, False])
def test_wall_time_keeps_the_time_a_preempted_call_lost(backend, shared_core, counters, cpu_clock):
    # the machine probe runs after an outermost exit, outside the window by design: a slice the hog takes from it is
    # the SDK's time, not the call's, and would read here as time the window left out
    instrument.configure(counters=counters, cpu_clock=cpu_clock, machine_probe=False)
    st = instrument.stage("spin")
    mine = []
    for _ in range(50):
        t = time.perf_counter_ns()
        with st:
            sum(range(100_000))   # about 2 ms of CPU: the hog takes the core from it mid-call, often
        mine.append(time.perf_counter_ns() - t)
    s = instrument.snapshot()["spin"]
    own = sum(mine)
    assert s.calls == 50
    assert s.wall_total <= own, "the SDK's window lies inside the caller's"
    # what the SDK leaves out is its own enter/exit work outside the window, its reads included (docs/estimates.md:
    # a preemption at a read is the SDK's, not the call's): beside a hog on the core, 0.3 % when the reads were
    # inside the window, 2-5 % now, 11 % once beside a hog per core as well; a read that preempts (the thread CPU
    # clock's) outside the window would leave out whole preempted slices, a third of the time or more
    per_call = 100_000 if backend.__name__.endswith("pure") else 20_000
    assert own - s.wall_total <= 0.2 * own + 50 * per_call, (own, s.wall_total, counters, cpu_clock)
