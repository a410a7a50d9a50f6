"""Per-worker snapshot files: whole after a SIGKILL at any moment, every completed
outermost call in them, merges that never decrease."""
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import instrument
from instrument.serve import multiproc
from instrument.snapshot import SnapshotError
from snapfactory import env, snap, st


def test_file_round_trip_and_growth(tmp_path):
    f = multiproc.SnapshotFile(str(tmp_path / "instrument-1-a.snap"))
    assert multiproc.read(f.path) is None                      # nothing written yet
    for n in (1, 2, 3):
        f.write(snap(st("a", n, 1000)).to_json().encode())
        assert multiproc.read(f.path)["a"].calls == n
    big = snap(*[st(f"s{i}", 5, 1000 + i) for i in range(3000)])   # well over the first 64 KiB slot
    f.write(big.to_json().encode())
    assert multiproc.read(f.path) == big
    f.write(snap(st("a", 9, 1000)).to_json().encode())          # the other slot grows too
    f.write(big.to_json().encode())
    assert multiproc.read(f.path) == big
    f.close()
    assert os.path.getsize(f.path) < 8 * len(big.to_json())


def test_files_that_are_not_ours_are_refused_with_the_reason(tmp_path):
    (tmp_path / "instrument-1-x.snap").write_bytes(b"hello")
    with pytest.raises(SnapshotError, match="not an instrument snapshot file"):
        multiproc.read(str(tmp_path / "instrument-1-x.snap"))
    (tmp_path / "instrument-2-x.snap").write_bytes(b"NOTMAGIC" + bytes(100))
    with pytest.raises(SnapshotError, match="magic"):
        multiproc.read(str(tmp_path / "instrument-2-x.snap"))
    snap(st("a", 3, 10)).save(tmp_path / "saved.json")
    assert multiproc.merged_snapshot(str(tmp_path))["a"].calls == 3   # the others are skipped
    with pytest.raises(ValueError, match="not a folder"):
        multiproc.merged_snapshot(str(tmp_path / "missing"))


def test_a_slot_cut_short_leaves_the_previous_one(tmp_path):
    """What a writer killed between its pwrite()s leaves: every prefix of the write sequence reads whole."""
    path = str(tmp_path / "instrument-1-a.snap")
    f = multiproc.SnapshotFile(path)
    f.write(snap(st("a", 1, 10)).to_json().encode())
    data = snap(st("a", 2, 10)).to_json().encode()
    off = f.slots[0][0]
    os.pwrite(f.fd, multiproc.SLOT.pack(0, 0, 0, 0), off)         # step 1 only
    assert multiproc.read(path)["a"].calls == 1
    os.pwrite(f.fd, data[: len(data) // 2], off + multiproc.SLOT.size)   # step 2, cut short
    assert multiproc.read(path)["a"].calls == 1
    import zlib
    os.pwrite(f.fd, multiproc.SLOT.pack(2, len(data), zlib.crc32(data), 0), off)   # a head over torn data
    assert multiproc.read(path)["a"].calls == 1
    f.close()


KILLED_WRITER = """
import sys
from instrument.serve import multiproc
from instrument.snapshot import Snapshot, StageStats
f = multiproc.SnapshotFile(sys.argv[1])
n = 0
print("ready", flush=True)
while True:
    n += 1
    stages = [StageStats(("s%d" % i,), n, 0, n, n, 1, 1, None, None, 0, {0: n}) for i in range(1 + n % 400)]
    f.write(Snapshot(stages, {"pid": 1, "n": n}).to_json().encode())
"""


def test_sigkill_at_random_moments_always_leaves_a_whole_snapshot(tmp_path):
    rng = random.Random(7)
    for k in range(12):
        path = str(tmp_path / f"instrument-{k}-k.snap")
        p = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, path], stdout=subprocess.PIPE, text=True, env=env())
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.01, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        s = multiproc.read(path)
        n = s.meta["n"]
        assert n >= 1 and len(s) == 1 + n % 400 and all(x.calls == n for x in s)


def test_a_reader_never_sees_a_torn_or_older_snapshot(tmp_path):
    path = str(tmp_path / "instrument-1-r.snap")
    f = multiproc.SnapshotFile(path)
    f.write(snap(st("a", 1, 10)).to_json().encode())
    stop = threading.Event()

    def write():
        n = 1
        while not stop.is_set():
            n += 1
            f.write(snap(*[st(f"s{i}", n, 10) for i in range(1 + n % 200)], st("a", n, 10)).to_json().encode())
    t = threading.Thread(target=write)
    t.start()
    try:
        seen = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and len(seen) < 2000:
            seen.append(multiproc.read(path)["a"].calls)
    finally:
        stop.set()
        t.join()
        f.close()
    assert seen == sorted(seen) and seen[-1] > seen[0]


ROOT_CALLS = """
import sys, instrument
w = instrument.start_snapshot_writer(sys.argv[1], interval=3600)   # only the per-call writes can save these
n = 0
while True:
    with instrument.stage("request"):
        with instrument.stage("inner"):
            pass
    n += 1
    print(n, flush=True)
    if n == int(sys.argv[2]):
        sys.stdin.read()
"""


@pytest.mark.parametrize("pure", ["0", "1"])
def test_sigkill_keeps_every_completed_outermost_call(tmp_path, pure):
    """Killed while idle: exactly its calls.  Killed mid-loop: at least every call it
    reported, at most one more (completed, saved, not yet reported)."""
    e = dict(env(), INSTRUMENT_PURE_PYTHON=pure)
    p = subprocess.Popen([sys.executable, "-c", ROOT_CALLS, str(tmp_path), "137"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=e)
    last = 0
    while last < 137:
        last = int(p.stdout.readline())
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    s = multiproc.merged_snapshot(str(tmp_path))
    assert s["request"].calls == 137 and s["request/inner"].calls == 137
    assert s.meta["backend"]["name"] == ("pure" if pure == "1" else "native")

    for k in range(3):
        d = tmp_path / f"loop{k}"
        d.mkdir()
        p = subprocess.Popen([sys.executable, "-c", ROOT_CALLS, str(d), "0"], stdout=subprocess.PIPE, text=True,
                             env=e)
        stop_at = random.Random(k).randint(200, 3000)
        last = 0
        while last < stop_at:
            last = int(p.stdout.readline())
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        rest = p.stdout.read().split()
        reported = int(rest[-1]) if rest else last
        calls = multiproc.merged_snapshot(str(d))["request"].calls
        assert reported <= calls <= reported + 1, (reported, calls)


def test_writer_coalesces_concurrent_exits_and_counts_every_call(tmp_path, backend):
    w = instrument.start_snapshot_writer(str(tmp_path), interval=3600)
    try:
        def work():
            for _ in range(300):
                with instrument.stage("request"):
                    pass
        ts = [threading.Thread(target=work) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert multiproc.read(w.path)["request"].calls == 2400
        assert 1 <= w.writes <= 2400 and w.failures == 0
    finally:
        instrument.stop_snapshot_writer()
    with instrument.stage("request"):
        pass   # no writer any more: the hot path makes no call
    assert multiproc.read(w.path)["request"].calls == 2400


def test_a_forked_child_keeps_a_file_of_its_own(tmp_path, backend):
    import multiprocessing
    w = instrument.start_snapshot_writer(str(tmp_path), interval=3600)
    try:
        for _ in range(3):
            with instrument.stage("parent"):
                pass
        ctx = multiprocessing.get_context("fork")

        def child():
            for _ in range(5):
                with instrument.stage("child"):
                    pass
            os._exit(0)   # as a killed worker would: no exit-time save
        p = ctx.Process(target=child)
        p.start()
        p.join(60)
        assert p.exitcode == 0
        names = sorted(os.listdir(tmp_path))
        assert len(names) == 2 and os.path.basename(w.path) in names
        merged = multiproc.merged_snapshot(str(tmp_path))
        assert merged["parent"].calls == 3 and merged["child"].calls == 5
        assert multiproc.read(w.path).get("child") is None
    finally:
        instrument.stop_snapshot_writer()


def test_file_names_never_repeat_for_one_pid(tmp_path, backend):
    a = instrument.start_snapshot_writer(str(tmp_path), interval=3600).path
    b = instrument.start_snapshot_writer(str(tmp_path), interval=3600).path
    instrument.stop_snapshot_writer()
    assert a != b and str(os.getpid()) in a


def test_writer_failures_never_reach_the_caller(tmp_path, backend):
    w = instrument.start_snapshot_writer(str(tmp_path), interval=3600)
    own, w.file.fd = w.file.fd, os.open(os.devnull, os.O_RDONLY)   # every write now fails (EBADF), as on a lost disk
    try:
        for _ in range(5):
            with instrument.stage("request"):
                pass
        assert w.failures == 5
        assert instrument.snapshot()["request"].calls == 5
    finally:
        os.close(w.file.fd)
        w.file.fd = own
        instrument.stop_snapshot_writer()
    assert multiproc.read(w.path)["request"].calls == 5   # the next write that could, wrote them all


def test_bad_arguments_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="interval must be a positive number"):
        multiproc.start_snapshot_writer(str(tmp_path), interval=0, source=instrument.snapshot)
    with pytest.raises(TypeError, match="needs source="):
        multiproc.start_snapshot_writer(str(tmp_path))
    with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR is not set"):
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
        multiproc.start_snapshot_writer(source=instrument.snapshot)
