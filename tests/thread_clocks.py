"""A thread's own clocks, read by a test or a benchmark as the truth a stage's split is checked against: wall,
CPU and the kernel's run-queue time at one moment, read without letting go of the GIL (a Python-level read of
/proc lets go of it, and another thread taking it puts run-queue time after the moment read); and another
thread's CPU clock by its id."""
import ctypes
import os
import threading
import time

_libc = ctypes.PyDLL(None)   # PyDLL: its calls keep the GIL
_libc.pread.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
_libc.pread.restype = ctypes.c_ssize_t
_fds = threading.local()


def schedstat():
    """This thread's run-queue time and timeslices so far (/proc/thread-self/schedstat), read without letting go
    of the GIL."""
    if not hasattr(_fds, "fd"):
        _fds.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)   # per thread: thread-self resolves at open
    buf = ctypes.create_string_buffer(128)
    n = _libc.pread(_fds.fd, buf, 127, 0)
    fields = buf.raw[:n].split()
    return int(fields[1]), int(fields[2])


def edge():
    """(wall, CPU, run queue) at one moment: read again until no timeslice ended among the reads (a preemption
    between them would put run-queue time on one side of the wall clock and count it on the other)."""
    while True:
        r1, n1 = schedstat()
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        r2, n2 = schedstat()
        if n1 == n2:
            return w, c, r2


def thread_cpu_ns(tid):
    """Another thread's CPU time so far, from its own CPU clock (MAKE_THREAD_CPUCLOCK(tid, SCHED))."""
    return time.clock_gettime_ns((~tid << 3) | 6)
