"""Loaded at interpreter start by `instrument run` (this folder is first on
PYTHONPATH): imports instrument, which reads INSTRUMENT_OUTPUT and saves at
exit, and makes sure a snapshot is also saved on SIGTERM and in
multiprocessing children, which leave through os._exit.  Then it runs the
sitecustomize that this one shadows, if there is one."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _save():
    try:
        from instrument.live import collector
        collector._save_at_exit()
    except Exception:
        pass


def _die(signum):
    """End the process as the signal's default action would, from any thread: the status stays "killed by signal"."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
        libc.signal(signum, None)   # SIG_DFL; signal.signal() may be called from the main thread only
        os.kill(os.getpid(), signum)
        import time
        time.sleep(10)              # the signal ends the process meanwhile
    finally:
        os._exit(128 + signum)      # where it could not be re-delivered


def _install_signals():
    """A snapshot is saved on a signal where it would kill the process without atexit.  The handler runs in the main
    thread between two bytecodes; a main thread blocked in a call that does not return on a signal (a collective
    waiting for a rank that died, a long native call that released the GIL) would run it only when that call
    returns, and a launcher's SIGKILL may come first.  So, through the C core, the signal also wakes a watcher
    thread (a handler in front of CPython's writes to its pipe), which saves the snapshot and ends the process by the
    signal where the handler has not started within a moment.  A program that sets its own handler takes the
    signal over, watcher included.  Without the C core, the handler alone."""
    import signal
    import threading

    ours, started = set(), threading.Event()

    def handler(signum, frame):
        started.set()
        _save()
        signal.signal(signum, signal.SIG_DFL)   # re-deliver, so the status stays "killed by signal"
        os.kill(os.getpid(), signum)

    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        sig = getattr(signal, name, None)
        # only defaults that kill without atexit; Python's SIGINT handler raises KeyboardInterrupt and exits through it
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, handler)
            ours.add(int(sig))
    from instrument.live import backend
    native = backend.current
    if not ours or not hasattr(native, "sigwake_chain"):   # the fallback: the handler alone
        return
    try:
        rfd, wfd = _pipe()
    except OSError:   # no fd left: the handler alone
        return
    try:
        chained = any([native.sigwake_chain(s, wfd) for s in ours])
    except (OSError, ValueError):
        chained = False
    if not chained:
        os.close(rfd), os.close(wfd)
        return

    def watch(rfd):
        import select
        poll = select.poll()
        poll.register(rfd, select.POLLIN)
        while True:
            try:
                poll.poll()
                data = os.read(rfd, 512)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            for signum in data:
                if signum in ours and not started.wait(0.5) and signal.getsignal(signum) is handler:
                    _save_and_die(signum)

    def start(rfd):
        threading.Thread(target=watch, args=(rfd,), name="instrument-signal-watch", daemon=True).start()

    def after_fork_child():
        # the parent's pipe is not written from here (the handler checks the process); the child gets its own
        nonlocal rfd, wfd
        try:
            os.close(rfd), os.close(wfd)
            rfd, wfd = _pipe()
            native.sigwake_fd(wfd)
            start(rfd)
        except Exception:
            pass

    start(rfd)
    os.register_at_fork(after_in_child=after_fork_child)


def _pipe():
    """A non-blocking pipe, its fds moved above the low numbers a program may close and open again."""
    import fcntl

    def high(fd):
        try:
            new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 512)
        except OSError:   # a low fd limit: as it is
            return fd
        os.close(fd)
        return new

    rfd, wfd = (high(fd) for fd in os.pipe())
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    return rfd, wfd


def _save_and_die(signum):
    """The watcher's end: saves, and ends the process as the signal's default action would, holding the save's lock
    (the main thread's handler starts no save of its own to be cut short).  A save that hangs (a device that does
    not answer) ends at 20 s, by the signal all the same."""
    import threading
    threading.Timer(20, _die, (signum,)).start()
    try:
        from instrument.live import collector
        with collector._save_lock:
            collector._save_at_exit()
            _die(signum)
    except Exception:
        pass
    _die(signum)


def _patch_multiprocessing():
    from multiprocessing import process
    orig = process.BaseProcess._bootstrap
    if getattr(orig, "_instrument", False):
        return

    def _bootstrap(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        finally:
            _save()   # the child ends with os._exit, which skips atexit

    _bootstrap._instrument = True
    process.BaseProcess._bootstrap = _bootstrap


def _start():
    root = os.path.dirname(os.path.dirname(_HERE))
    if "instrument" not in sys.modules:
        sys.path.insert(0, root)   # the instrument this bootstrap belongs to, not another on the path
        try:
            import instrument  # noqa: F401
        finally:
            try:
                sys.path.remove(root)
            except ValueError:
                pass
    _install_signals()
    _patch_multiprocessing()


def _chain():
    """Run the sitecustomize found after this folder on sys.path, as site would have."""
    import importlib.util
    me = sys.modules.get(__name__)
    saved = sys.path[:]
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
        spec = importlib.util.find_spec("sitecustomize") if me is not None else None
        if spec is None or spec.origin == __file__:
            return
        sys.modules.pop("sitecustomize", None)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)
    except Exception as e:
        sys.stderr.write(f"Error in sitecustomize (chained from instrument); set PYTHONVERBOSE for details: "
                         f"{type(e).__name__}: {e}\n")
    finally:
        sys.path[:] = saved
        sys.modules["sitecustomize"] = me


if os.environ.get("INSTRUMENT_OUTPUT"):
    try:
        _start()
    except Exception as e:   # never stop the program from starting
        sys.stderr.write(f"instrument: bootstrap failed, running without it: {type(e).__name__}: {e}\n")
_chain()
