"""Snapshots shared by several processes of one service (gunicorn workers, multiprocessing).

Each process keeps its snapshot in a file of its own in a shared folder,
`<folder>/instrument-<pid>-<token>.snap`, which it rewrites in place; any process
reads the folder and serves the exact merge (`merged_snapshot`).  The writer is
given a snapshot function (`source`) and, through `root_exit()`, is called by the
live side after every outermost stage exit (`instrument.start_snapshot_writer()`
wires both), so a worker killed with SIGKILL leaves every call whose outermost
stage had exited in its file.  A periodic save (every `interval` seconds) covers
stages still open, and one more runs at exit.

The file: a 64-byte header (magic, version, and for each of two slots its offset
and capacity) and two slots, written alternately.  A slot is a 24-byte head
(sequence number, length, CRC-32 of the data) and the snapshot's JSON.  A write
first zeroes the head of the older slot, then writes the data, then the head, with
pwrite(): a writer killed at any point leaves the other slot whole, and a reader
takes the valid slot with the highest sequence number, checking that it did not
change while it was read.  Writes reach the page cache, not the disk: a killed
process loses nothing, a crashed machine may.

Nothing here imports the live side; this module reads and writes Snapshots only.
"""
from __future__ import annotations

import atexit
import glob
import json
import os
import secrets
import struct
import threading
import time
import zlib
from typing import Callable, List, Optional, Tuple

from .. import config
from ..snapshot import Snapshot, SnapshotError

MAGIC = b"INSTSNAP"
VERSION = 1
HEADER = struct.Struct("<8sII4Q")          # magic, version, reserved, off0, cap0, off1, cap1
SLOT = struct.Struct("<QQII")               # seq, length, crc32, reserved
FIRST_CAPACITY = 64 << 10
MAX_FILE_BYTES = 1 << 30                   # as Snapshot.load: larger files are refused unread
PATTERN = "instrument-*.snap"


def folder(directory: Optional[str] = None) -> str:
    """`directory`, or $PROMETHEUS_MULTIPROC_DIR; ValueError when neither is given."""
    d = directory or config.shared_folder()
    if not d:
        raise ValueError(f"no folder given and {config.SHARED_FOLDER_VARIABLE} is not set")
    if not os.path.isdir(d):
        raise ValueError(f"{d}: not a folder (create it, empty, when the service starts)")
    return os.fspath(d)


# -------------------------------------------------------------------- the file
class SnapshotFile:
    """One process's file: `write(json_bytes)` replaces its content, whole or not at all."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            self.slots = [[HEADER.size, FIRST_CAPACITY], [HEADER.size + FIRST_CAPACITY, FIRST_CAPACITY]]
            self.size = HEADER.size + 2 * FIRST_CAPACITY
            os.ftruncate(self.fd, self.size)
            self._header()
        except BaseException:
            os.close(self.fd)
            raise
        self.seq = 0

    def _header(self) -> None:
        (o0, c0), (o1, c1) = self.slots
        os.pwrite(self.fd, HEADER.pack(MAGIC, VERSION, 0, o0, c0, o1, c1), 0)

    def write(self, data: bytes) -> None:
        seq = self.seq + 1
        x = seq % 2
        off, cap = self.slots[x]
        os.pwrite(self.fd, SLOT.pack(0, 0, 0, 0), off)               # this slot is no longer valid
        if SLOT.size + len(data) > cap:                                 # a new, larger region at the end
            cap = max(2 * (SLOT.size + len(data)), FIRST_CAPACITY)
            off = self.size
            if off + cap > MAX_FILE_BYTES:
                raise OSError(f"{self.path}: a snapshot of {len(data)} bytes would take the file over "
                              f"{MAX_FILE_BYTES} bytes")
            os.ftruncate(self.fd, off + cap)
            self.size = off + cap
        os.pwrite(self.fd, data, off + SLOT.size)
        os.pwrite(self.fd, SLOT.pack(seq, len(data), zlib.crc32(data), 0), off)
        if [off, cap] != self.slots[x]:
            self.slots[x] = [off, cap]
            self._header()                                              # only now does the slot point there
        self.seq = seq

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _slot(fd: int, off: int, cap: int) -> Tuple[int, Optional[bytes]]:
    head = os.pread(fd, SLOT.size, off)
    if len(head) < SLOT.size:
        return 0, None
    seq, n, crc, _ = SLOT.unpack(head)
    if not seq or n > cap - SLOT.size:
        return 0, None
    data = os.pread(fd, n, off + SLOT.size)
    if len(data) != n or zlib.crc32(data) != crc:
        return 0, None   # being rewritten, or cut short by a writer that was killed
    return seq, data


def read_bytes(path: str, attempts: int = 200) -> Optional[bytes]:
    """The newest whole snapshot JSON of a file (None when it has none yet); SnapshotError when it is not
    such a file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        size = os.fstat(fd).st_size
        if size > MAX_FILE_BYTES:
            raise SnapshotError(f"{path}: {size} bytes is over the {MAX_FILE_BYTES} byte limit")
        for attempt in range(attempts):
            raw = os.pread(fd, HEADER.size, 0)
            if len(raw) < HEADER.size:
                raise SnapshotError(f"{path}: not an instrument snapshot file (shorter than its header)")
            magic, version, _, o0, c0, o1, c1 = HEADER.unpack(raw)
            if magic != MAGIC:
                raise SnapshotError(f"{path}: not an instrument snapshot file (magic {magic!r})")
            if version > VERSION:
                raise SnapshotError(f"{path}: snapshot file version {version} is newer than this instrument reads "
                                    f"({VERSION}); upgrade instrument")
            found = [_slot(fd, o0, c0), _slot(fd, o1, c1)]
            seq, data = max(found, key=lambda t: t[0])
            if data is None:
                if all(os.pread(fd, 8, o)[:8] == b"\0" * 8 for o in (o0, o1)):
                    return None   # nothing written yet
            else:
                off = o0 if found[0][0] == seq else o1
                if SLOT.unpack(os.pread(fd, SLOT.size, off))[0] == seq:
                    return data   # unchanged while it was read
            if attempt >= 3:
                time.sleep(0.001)
        raise SnapshotError(f"{path}: no whole snapshot after {attempts} attempts (rewritten continuously?)")
    finally:
        os.close(fd)


def read(path: str) -> Optional[Snapshot]:
    """The Snapshot in a process's file, or None when it has written none yet."""
    data = read_bytes(path)
    if data is None:
        return None
    try:
        return Snapshot.from_dict(json.loads(data.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SnapshotError(f"{path}: {e}") from None


def files(directory: Optional[str] = None) -> List[str]:
    """The snapshot files of a folder: the processes' .snap files and whole snapshots saved as .json."""
    d = folder(directory)
    return sorted(glob.glob(os.path.join(d, PATTERN))) + sorted(glob.glob(os.path.join(d, "*.json")))


def merged_snapshot(directory: Optional[str] = None) -> Snapshot:
    """The exact merge of every process's snapshot in the folder.  Files that are not
    snapshots are skipped; a process's file only grows, so the merge never decreases
    as long as no file is removed."""
    out = None
    for p in files(directory):
        try:
            s = read(p) if p.endswith(".snap") else Snapshot.load(p)
        except SnapshotError:
            continue
        if s is not None:
            out = s if out is None else out.merge(s)
    return out if out is not None else Snapshot([], {"merged_from": []})


def save_snapshot(source: Callable[[], Snapshot], directory: Optional[str] = None) -> str:
    """Save `source()` once as <folder>/instrument.<pid>.json (atomic: temp file, fsync, rename)."""
    return source().save(os.path.join(folder(directory), f"instrument.{os.getpid()}.json"))


# ------------------------------------------------------------------ the writer
class SnapshotWriter:
    """Keeps this process's file current: `root_exit()` after every outermost stage exit
    (synchronous: when it returns, the call is in the file), every `interval` seconds,
    and at exit.  A forked child starts a file of its own."""

    def __init__(self, source: Callable[[], Snapshot], directory: str, interval: float) -> None:
        self.source, self.directory, self.interval = source, directory, interval
        self.failures = 0
        self.writes = 0
        self._start()

    def _start(self) -> None:
        self.pid = os.getpid()
        self.path = os.path.join(self.directory, f"instrument-{self.pid}-{secrets.token_hex(4)}.snap")
        self.file = SnapshotFile(self.path)
        self._count_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._issued = self._written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="instrument-snapshot-writer", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            self.save()

    def save(self) -> bool:
        """Write the snapshot now; False (and counted in `failures`) when it could not be."""
        with self._write_lock:
            return self._save_locked()

    def _save_locked(self) -> bool:
        if self.file.fd < 0 or os.getpid() != self.pid:
            return False
        try:
            self.file.write(self.source().to_json(percentiles=False).encode("utf-8"))   # loading recomputes them
            self.writes += 1
            return True
        except Exception:
            self.failures += 1   # a full disk must not take the worker down; the next write tries again
            return False

    def root_exit(self) -> None:
        """An outermost stage exited (its call is recorded): put it in the file before returning.
        Writes that began after this call was recorded cover it, so concurrent exits share one."""
        with self._count_lock:
            self._issued += 1
            mine = self._issued
        with self._write_lock:
            if self._written >= mine:
                return
            with self._count_lock:
                upto = self._issued
            if self._save_locked():
                self._written = upto

    def after_fork_child(self) -> None:
        self.file.close()   # the parent's file stays the parent's
        self._start()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(30)
        self.save()
        self.file.close()


_writer: Optional[SnapshotWriter] = None
_hooks_installed = False


def start_snapshot_writer(directory: Optional[str] = None, interval: float = 5.0,
                          source: Optional[Callable[[], Snapshot]] = None) -> SnapshotWriter:
    """Keep this process's snapshot (`source()`) in a file of its own in the folder
    (default $PROMETHEUS_MULTIPROC_DIR), every `interval` seconds and at exit;
    processes forked afterwards keep their own.  Call the writer's `root_exit()`
    after each outermost stage exit for per-call saves (instrument.start_snapshot_writer
    does)."""
    global _writer, _hooks_installed
    d = folder(directory)
    if not callable(source):
        raise TypeError("start_snapshot_writer needs source=, a function returning the process's Snapshot "
                        "(instrument.snapshot)")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
    stop_snapshot_writer()
    _writer = SnapshotWriter(source, d, float(interval))
    if not _hooks_installed:
        _hooks_installed = True
        atexit.register(stop_snapshot_writer)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_restart_in_child)
    return _writer


def _restart_in_child() -> None:
    if _writer is not None:
        try:
            _writer.after_fork_child()
        except Exception:
            pass   # no file in the child: its calls are not shared (the folder is gone or full)


def stop_snapshot_writer() -> None:
    """Write a last time and stop."""
    global _writer
    w, _writer = _writer, None
    if w is not None:
        w.close()


def current_writer() -> Optional[SnapshotWriter]:
    return _writer


__all__ = ["SnapshotFile", "SnapshotWriter", "read", "read_bytes", "files", "merged_snapshot", "save_snapshot",
           "start_snapshot_writer", "stop_snapshot_writer", "current_writer", "folder"]
