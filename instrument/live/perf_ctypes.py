"""Pure-stdlib twin of ``instrument._native.CounterGroup``.

Same grouping, fallback and read format as csrc/perf.c, through ``syscall(SYS_perf_event_open)``,
``os.read`` and ``struct.unpack``.  It never uses rdpmc.  Used when the C extension is absent.
"""
import ctypes
import errno as _errno
import fcntl
import functools
import os
import platform
import struct

__all__ = ["CounterGroup", "perf_event_attr", "perf_event_open"]

_SYSCALL_NR = {"x86_64": 298, "amd64": 298, "i386": 336, "i686": 336, "aarch64": 241, "arm64": 241,
               "riscv64": 241, "armv7l": 364, "ppc64le": 319, "ppc64": 319, "s390x": 331}

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW = 0, 1, 3, 4
PERF_FORMAT_TOTAL_TIME_ENABLED, PERF_FORMAT_TOTAL_TIME_RUNNING, PERF_FORMAT_ID, PERF_FORMAT_GROUP = 1, 2, 4, 8
READ_FORMAT = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_ID
PERF_FLAG_FD_CLOEXEC = 1 << 3
# attr flag bits (the bitfield word after read_format)
ATTR_DISABLED, ATTR_EXCLUDE_KERNEL, ATTR_EXCLUDE_HV = 1 << 0, 1 << 5, 1 << 6
# _IO('$', 0) / _IOR('$', 7, __u64 *)
PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_ID = 0x2400, 0x80082407
PERF_IOC_FLAG_GROUP = 1
MAX_EVENTS, MAX_GROUPS = 16, 4


class perf_event_attr(ctypes.Structure):
    """struct perf_event_attr up to PERF_ATTR_SIZE_VER7 (128 bytes); the bitfields are one u64."""
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("__reserved_2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32),
        ("__reserved_3", ctypes.c_uint32),
        ("sig_data", ctypes.c_uint64),
    ]


assert ctypes.sizeof(perf_event_attr) == 128

_syscall = None
_machine = functools.lru_cache(maxsize=None)(lambda: platform.machine().lower())


def _libc_syscall():
    global _syscall
    if _syscall is None:
        fn = ctypes.CDLL(None, use_errno=True).syscall
        fn.restype = ctypes.c_long
        fn.argtypes = [ctypes.c_long, ctypes.POINTER(perf_event_attr), ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_ulong]
        _syscall = fn
    return _syscall


def perf_event_open(type_, config, group_fd=-1, exclude_kernel=True, disabled=False):
    """Opens one counter on the calling thread; returns the fd or -errno."""
    nr = _SYSCALL_NR.get(_machine())
    if nr is None:
        return -_errno.ENOSYS
    attr = perf_event_attr(type=type_, size=ctypes.sizeof(perf_event_attr), config=config,
                           read_format=READ_FORMAT)
    attr.flags = (ATTR_DISABLED if disabled else 0) | \
        (ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV if exclude_kernel else 0)
    fd = _libc_syscall()(nr, ctypes.byref(attr), 0, -1, group_fd, PERF_FLAG_FD_CLOEXEC)
    return fd if fd >= 0 else -ctypes.get_errno()


def _event_class(type_):
    if type_ in (PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW):
        return 0
    return 1 if type_ == PERF_TYPE_SOFTWARE else 2 + type_


class _Group:
    __slots__ = ("leader", "cls", "idx", "ids", "fmt", "size")

    def __init__(self, leader, cls):
        self.leader, self.cls, self.idx, self.ids = leader, cls, [], []

    def finish(self):
        self.fmt = struct.Struct("=3Q%dQ" % (2 * len(self.idx)))
        self.size = self.fmt.size


class CounterGroup:
    """CounterGroup(events: list[tuple[int, int]], exclude_kernel: bool = True)

    perf_event counters of the calling thread; read() returns raw cumulative
    (value, enabled, running) per event, zeros for events that are not open.
    """

    rdpmc = False

    def __init__(self, events, exclude_kernel=True):
        evs = [(int(t), int(c)) for t, c in events]
        if len(evs) > MAX_EVENTS:
            raise ValueError("at most %d events per CounterGroup, got %d" % (MAX_EVENTS, len(evs)))
        for t, c in evs:
            if not (0 <= t < 1 << 32 and 0 <= c < 1 << 64):
                raise OverflowError("event (%d, %d) out of range" % (t, c))
        self._events, self._fds, self._groups, self.closed = evs, [], [], False
        self.exclude_kernel = bool(exclude_kernel)
        if not self._open_pass(self.exclude_kernel):
            self._close_fds()  # as perf does: kernel counting refused, count user space only
            self.exclude_kernel = True
            self._open_pass(True)
        for g in self._groups:
            g.finish()
            fcntl.ioctl(g.leader, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)

    def _open_pass(self, exclude_kernel):
        n = len(self._events)
        self._fds, self._groups, self.status = [-1] * n, [], [0] * n
        for i, (t, c) in enumerate(self._events):
            cls, fd, err, group = _event_class(t), -1, 0, None
            for g in self._groups:  # fewest groups: join any group of its class
                if g.cls != cls:
                    continue
                fd = perf_event_open(t, c, g.leader, exclude_kernel)
                if fd >= 0:
                    group = g
                    break
                err = -fd
            if fd < 0 and len(self._groups) < MAX_GROUPS:
                # a leader starts disabled; it is enabled once its members are attached
                fd = perf_event_open(t, c, -1, exclude_kernel, disabled=True)
                if fd >= 0:
                    group = _Group(fd, cls)
                    self._groups.append(group)
                else:
                    err = -fd
            if fd < 0:
                self.status[i] = err or _errno.ENOSPC
                if not exclude_kernel and err in (_errno.EACCES, _errno.EPERM):
                    return False
                continue
            try:
                ident = struct.unpack("=Q", fcntl.ioctl(fd, PERF_EVENT_IOC_ID, b"\0" * 8))[0]
            except OSError:
                ident = 0  # kernels before 3.12: read order still matches open order
            group.idx.append(i)
            group.ids.append(ident)
            self._fds[i] = fd
        return True

    @property
    def groups(self):
        return len(self._groups)

    def read(self):
        if self.closed:
            raise ValueError("read of a closed CounterGroup")
        out = [(0, 0, 0)] * len(self._events)
        for g in self._groups:
            raw = g.fmt.unpack(os.read(g.leader, g.size))
            enabled, running = raw[1], raw[2]
            for j in range(raw[0]):
                value, ident = raw[3 + 2 * j], raw[4 + 2 * j]
                m = j if g.ids[j] in (ident, 0) else g.ids.index(ident)  # id 0: no PERF_EVENT_IOC_ID
                out[g.idx[m]] = (value, enabled, running)
        return out

    def _close_fds(self):
        for fd in self._fds:
            if fd >= 0:
                os.close(fd)
        self._fds, self._groups = [-1] * len(self._events), []

    def close(self):
        self._close_fds()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self._close_fds()
        except Exception:
            pass


class SwitchPage:
    """Whether the calling thread left the CPU, without a system call (as csrc/perf.c perf_switch_open): the kernel
    rewrites a perf event's mmap page, moving its seqlock, each time the thread is scheduled back in."""

    def __init__(self, fd: int, page) -> None:
        self.fd, self.page = fd, page

    @classmethod
    def open(cls):
        """The calling thread's page, or None where no context-switches event can be opened and mapped."""
        import mmap
        fd = perf_event_open(PERF_TYPE_SOFTWARE, 3, exclude_kernel=False)   # PERF_COUNT_SW_CONTEXT_SWITCHES
        if fd < 0:
            fd = perf_event_open(PERF_TYPE_SOFTWARE, 3, exclude_kernel=True)
        if fd < 0:
            return None
        try:
            return cls(fd, mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ))
        except (OSError, ValueError):
            os.close(fd)
            return None

    def seq(self) -> int:
        return struct.unpack_from("I", self.page, 8)[0]   # perf_event_mmap_page.lock

    def close(self) -> None:
        if self.fd >= 0:
            self.page.close()
            os.close(self.fd)
            self.fd = -1
