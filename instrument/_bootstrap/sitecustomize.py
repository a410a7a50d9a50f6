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


def _install_signals():
    import signal

    def handler(signum, frame):
        _save()
        prev = _previous.get(signum)
        if callable(prev):
            return prev(signum, frame)
        if prev == signal.SIG_IGN:
            return
        signal.signal(signum, signal.SIG_DFL)   # re-deliver, so the status stays "killed by signal"
        os.kill(os.getpid(), signum)

    _previous = {}
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        prev = signal.getsignal(sig)
        # only defaults that kill without atexit; Python's SIGINT handler raises KeyboardInterrupt and exits through it
        if prev is signal.SIG_DFL:
            _previous[sig] = prev
            signal.signal(sig, handler)


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
