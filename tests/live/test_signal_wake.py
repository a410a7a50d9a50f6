"""The C core's signal wake-up (csrc/sigwake.c): a handler in front of CPython's writes the signal's number to a
pipe, then CPython's handler runs; checked against the pipe's own contents and the Python handler's calls."""
import os
import signal

import pytest

_native = pytest.importorskip("instrument._native")


@pytest.fixture
def usr1():
    calls = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: calls.append(s))
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    yield calls, r, w
    signal.signal(signal.SIGUSR1, old)
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def _read(fd):
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""


def test_the_signal_is_written_then_pythons_handler_runs(usr1):
    calls, r, w = usr1
    assert _native.sigwake_chain(signal.SIGUSR1, w) is True
    assert _native.sigwake_chain(signal.SIGUSR1, w) is False          # in front already
    signal.raise_signal(signal.SIGUSR1)
    assert _read(r) == bytes([signal.SIGUSR1]) and calls == [signal.SIGUSR1]
    signal.signal(signal.SIGUSR1, lambda s, f: calls.append(-s))      # the program's own handler takes over
    signal.raise_signal(signal.SIGUSR1)
    assert _read(r) == b"" and calls == [signal.SIGUSR1, -signal.SIGUSR1]


def test_no_handler_of_pythons_nothing_chained():
    r, w = os.pipe()
    try:
        old = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        assert _native.sigwake_chain(signal.SIGUSR2, w) is False
        signal.signal(signal.SIGUSR2, old)
        with pytest.raises(ValueError, match="between 1 and"):
            _native.sigwake_chain(0, w)
        with pytest.raises(OSError):
            _native.sigwake_fd(10_000)                                  # not an open fd
    finally:
        os.close(r), os.close(w)


def test_a_forked_child_writes_nothing_to_the_parents_pipe_until_it_has_its_own(usr1):
    calls, r, w = usr1
    _native.sigwake_chain(signal.SIGUSR1, w)
    cr, cw = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.raise_signal(signal.SIGUSR1)          # the parent's pipe, inherited: not written
            os.set_blocking(cw, False)
            _native.sigwake_fd(cw)
            signal.raise_signal(signal.SIGUSR1)          # its own
            code = 0 if _read(cr) == bytes([signal.SIGUSR1]) and len(calls) == 2 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    os.close(cr), os.close(cw)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _read(r) == b""                               # the child's two signals: none reached this pipe
    _native.sigwake_fd(w)


def test_a_closed_pipe_whose_number_a_file_took_gets_no_byte(usr1, tmp_path):
    calls, r, w = usr1
    _native.sigwake_chain(signal.SIGUSR1, w)
    os.close(w)
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    if fd != w:                                                 # a file under the pipe's number
        os.dup2(fd, w)
        os.close(fd)
    signal.raise_signal(signal.SIGUSR1)
    assert calls == [signal.SIGUSR1] and (tmp_path / "log").read_bytes() == b""
