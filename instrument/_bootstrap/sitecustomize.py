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
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
        libc.signal(signum, None)   # SIG_DFL; signal.signal() may be called from the main thread only
        os.kill(os.getpid(), signum)
        import time
        time.sleep(10)              # the signal ends the process meanwhile
    finally:
        os._exit(128 + signum)      # where it could not be re-delivered


def _install_signals():
    """A snapshot is saved on a signal where it would kill the process without atexit.  The handler runs
    in the main thread between two bytecodes; a main thread blocked in a call that does not return on a signal (a
    collective waiting for a rank that died, a long native call that released the GIL) would run it only when that
    call returns, and a launcher's SIGKILL may come first.  So the signal also wakes a watcher thread (CPython's
    wakeup fd, written from its C-level handler), which saves the snapshot and ends the process if the handler has
    not started within a moment.  A program that sets its own handler, or its own wakeup fd, takes the signal over."""
    import signal
    import threading

    ours, started = {}, threading.Event()

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
            ours[int(sig)] = sig
    if not ours:
        return

    def watch(rfd):
        import select
        poll = select.poll()   # (select() refuses an fd past 1023: a forked child of a busy server may get one)
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
                if signum in ours and signal.getsignal(ours[signum]) is handler and not started.wait(0.5):
                    _save()
                    _die(signum)

    def open_pipe():
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        return rfd, wfd

    def start(rfd):
        threading.Thread(target=watch, args=(rfd,), name="instrument-signal-watch", daemon=True).start()

    try:
        rfd, wfd = open_pipe()
        other = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        if other != -1:   # the program's own (a sitecustomize before this one): left in place, the handler only
            signal.set_wakeup_fd(other)
            os.close(rfd), os.close(wfd)
            return
        start(rfd)
    except (OSError, ValueError):
        return

    def after_fork_child():
        # the wakeup fd's number is kept by CPython: point it at a pipe of the child's own, and watch that
        nonlocal rfd
        try:
            new_r, new_w = open_pipe()
            os.dup2(new_w, wfd, inheritable=False)
            os.close(new_w)
            os.close(rfd)
            rfd = new_r
            start(rfd)
        except Exception:
            pass

    os.register_at_fork(after_in_child=after_fork_child)


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
