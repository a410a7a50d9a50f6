"""perf_event counters per stage, checked against known answers (software events:
this machine may have no PMU; the hardware path shares the same group code)."""
import mmap
import os
import threading
import time

import pytest

import instrument
from instrument import counters
from instrument.live import perf
from conftest import run_python

SW = ["task-clock", "page-faults", "context-switches", "cpu-migrations"]


def touch(pages):
    m = mmap.mmap(-1, pages * mmap.PAGESIZE)
    for i in range(pages):
        m[i * mmap.PAGESIZE] = 1
    m.close()


def by_path(snap):
    return {s.path: s for s in snap}


def test_page_faults_of_a_stage_match_pages_touched(backend):
    instrument.configure(counters=SW)

    def run(inner, own):
        with instrument.stage("outer"):
            with instrument.stage("touch"):
                touch(inner)
            touch(own)
        p = by_path(instrument.snapshot())
        return p[("outer", "touch")], p[("outer",)]

    # a first call touching a page makes the stage machinery's own first-use pages (a sanitizer's
    # shadow memory, say) fault there; the second call's faults are the difference of the two snapshots
    t0, o0 = run(1, 1)
    t, o = run(3000, 500)
    inner = t.counter("page-faults") - t0.counter("page-faults")
    own = o.counter("page-faults", "self") - o0.counter("page-faults", "self")
    assert abs(inner - 3000) <= 3000 * 0.02
    assert abs(own - 500) <= 500 * 0.02 + 5
    assert o.counter("page-faults") == pytest.approx(o.counter("page-faults", "self") + t.counter("page-faults"))
    assert t.counters["page-faults"]["scaled"] is False and t.counters["page-faults"]["running_fraction"] == 1.0


def test_cpu_utilisation_sleep_low_spin_high(backend):
    instrument.configure(counters=SW)
    with instrument.stage("sleep"):
        time.sleep(0.05)
    with instrument.stage("spin"):
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 50_000_000:
            pass
        spent = time.thread_time_ns() - t0
    p = by_path(instrument.snapshot())
    sleep, spin = p[("sleep",)], p[("spin",)]
    d_sleep = counters.derived({k: v["total"] for k, v in sleep.counters.items()}, sleep.wall_total)
    assert d_sleep["cpu_utilisation"] < 0.1
    assert sleep.counter("context-switches") >= 1
    # task-clock is the CPU time of the spin (VM steal time can only add to it)
    assert spin.counter("task-clock") >= spent * 0.95
    assert spin.cpu_total == spin.counter("task-clock")


def test_two_threads_get_their_own_counts(backend):
    instrument.configure(counters=SW)
    results = {}

    def work(name, pages):
        with instrument.stage(name):
            touch(pages)
        results[name] = pages

    ts = [threading.Thread(target=work, args=("small", 400)), threading.Thread(target=work, args=("big", 2400))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    with instrument.stage("both"):
        touch(800)
    p = by_path(instrument.snapshot())
    assert abs(p[("small",)].counter("page-faults") - 400) <= 10
    assert abs(p[("big",)].counter("page-faults") - 2400) <= 50
    total = sum(p[(n,)].counter("page-faults") for n in ("small", "big", "both"))
    assert abs(total - 3600) <= 3600 * 0.02


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def test_no_fd_leak_under_thread_churn(backend):
    instrument.configure(counters=SW)
    with instrument.stage("warm"):
        pass
    before = fd_count()

    def one():
        with instrument.stage("short"):
            pass

    for batch in range(20):
        ts = [threading.Thread(target=one) for _ in range(100)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert fd_count() == before
    assert by_path(instrument.snapshot())[("short",)].calls == 2000


def test_fork_child_counts_its_own(tmp_path):
    code = f"""
import mmap, os, instrument
instrument.configure(counters=["page-faults", "task-clock"])
def touch(n):
    m = mmap.mmap(-1, n * mmap.PAGESIZE)
    for i in range(n):
        m[i * mmap.PAGESIZE] = 1
with instrument.stage("parent_work"):
    touch(1000)
pid = os.fork()
if pid == 0:
    with instrument.stage("child_work"):
        touch(700)
    instrument.snapshot().save({str(tmp_path / 'child.json')!r})
    os._exit(0)
os.waitpid(pid, 0)
with instrument.stage("parent_work"):
    touch(300)
instrument.snapshot().save({str(tmp_path / 'parent.json')!r})
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    child = by_path(instrument.Snapshot.load(tmp_path / "child.json"))
    parent = by_path(instrument.Snapshot.load(tmp_path / "parent.json"))
    assert ("parent_work",) not in child
    assert abs(child[("child_work",)].counter("page-faults") - 700) <= 20
    assert abs(parent[("parent_work",)].counter("page-faults") - 1300) <= 30
    assert ("child_work",) not in parent


def test_unavailable_events_reported_with_reason_not_zero(backend):
    instrument.configure(counters=["cycles", "instructions", "page-faults"])
    with instrument.stage("s"):
        touch(10)
    snap = instrument.snapshot()
    ev = snap.meta["counters"]["events"]
    probe = perf.probe(["cycles"])["events"]["cycles"]
    assert ev["cycles"]["available"] == probe["available"]
    if not probe["available"]:
        assert ev["cycles"]["reason"] and ev["cycles"]["errno"]
        assert snap["s"].counter("cycles") is None           # never counted: null, not 0
        assert snap["s"].counters["cycles"]["counted_calls"] == 0
    assert snap["s"].counter("page-faults") >= 10


def test_unknown_counter_rejected_with_the_known_names():
    with pytest.raises(ValueError, match="unknown counter 'cycels'; known: cycles, instructions"):
        instrument.configure(counters="cycels,page-faults")
    with pytest.raises(ValueError, match="INSTRUMENT_COUNTERS"):
        from instrument import config
        config.from_env({"INSTRUMENT_COUNTERS": "bogus"}, strict=True)
    instrument.configure(counters="r01c2,page-faults")        # raw codes are accepted


def test_explicit_request_for_unavailable_counter_warns_once():
    r = run_python("import instrument\nfor i in range(100):\n    with instrument.stage('s'): pass\n",
                   env={"INSTRUMENT_COUNTERS": "cycles,page-faults"})
    assert r.returncode == 0
    if perf.probe(["cycles"])["events"]["cycles"]["available"]:
        pytest.skip("this machine has a PMU")
    assert r.stderr.count("perf counters unavailable: cycles") == 1


def test_the_default_counters_warn_alike_whether_set_or_implied():
    """INSTRUMENT_COUNTERS=default asks for no more than leaving it unset: neither warns about the hardware
    events a VM lacks."""
    said = []
    for env in ({}, {"INSTRUMENT_COUNTERS": "default"}):
        r = run_python("import instrument\nwith instrument.stage('s'): pass\n"
                       "print(instrument.snapshot()['s'].calls)", env=env)
        assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
        said.append(r.stderr)
    assert said[0] == said[1] and "perf counters unavailable" not in said[1]


def test_fds_cannot_be_opened_timing_goes_on():
    code = """
import resource, os, warnings, instrument
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
used = len(os.listdir('/proc/self/fd'))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 1, hard))
keep = []
try:
    while True:
        keep.append(os.open('/dev/null', os.O_RDONLY))
except OSError:
    pass
import threading
def work():
    for i in range(50):
        with instrument.stage('s'):
            pass
t = threading.Thread(target=work); t.start(); t.join()
for fd in keep: os.close(fd)
snap = instrument.snapshot()
print(snap['s'].calls, snap['s'].counter('page-faults'))
"""
    r = run_python(code, env={"INSTRUMENT_COUNTERS": "page-faults,task-clock"})
    assert r.returncode == 0, r.stderr
    calls, faults = r.stdout.split()
    assert calls == "50" and faults == "None"


def test_ctypes_and_c_groups_read_the_same_kind_of_numbers():
    from instrument.live import perf_ctypes as _perf_ctypes
    from instrument import _native
    for cls in (_perf_ctypes.CounterGroup, _native.CounterGroup):
        with cls([counters.resolve("page-faults")[:2]], exclude_kernel=False) as g:
            (v0, e0, r0), = g.read()
            touch(1000)
            (v1, e1, r1), = g.read()
        assert abs((v1 - v0) - 1000) <= 20 and e1 >= e0 and r1 >= r0
