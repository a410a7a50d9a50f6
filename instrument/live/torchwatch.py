"""Installs the torch integrations (profiler ranges, GPU timing, torch.distributed) once
torch is imported, and never imports torch itself.

When instrument is imported or configured, or `instrument.profile()` is called,
with torch already in sys.modules, they are installed at once.  Otherwise a
finder at the front of sys.meta_path waits for `import torch`: it finds nothing
itself, wraps torch's loader so that the integrations are installed right after
torch's own module has run, and then removes itself, so imports cost nothing
afterwards.  `importlib.util.find_spec("torch")` alone (availability checks)
does not remove it.  With the `torch`, `gpu` and `collectives` options off nothing is installed.
A process that a launcher (torchrun) started names its rank from the start.
"""
from __future__ import annotations

import sys

from .. import config
from . import callsite, distributed, gpu, hooks, integrations, torch_profiler

_ready = False
_cfg = None   # the configuration in force, as the collector last applied it


def _torch_imported() -> bool:
    t = sys.modules.get("torch")
    return t is not None and hasattr(t, "autograd")   # None: import blocked; no autograd: still importing


def on_configure(cfg) -> None:
    """Runs at import and at every configure() (the collector calls it)."""
    global _cfg
    _cfg = cfg
    hooks.reinstall()
    if _ready:
        _apply(cfg)
        return
    if config.launcher_rank():
        integrations.register(distributed.INTEGRATION)
    if cfg.torch == "off" and cfg.gpu == "off" and not cfg.collectives:
        return
    if "on" in (cfg.torch, cfg.gpu):
        _register()   # so meta says why it is not working yet
    if _torch_imported():
        _on_torch(cfg)
    elif _WATCHER not in sys.meta_path:
        sys.meta_path.insert(0, _WATCHER)


def ensure() -> None:
    """Install now if torch is imported (instrument.profile and snapshot call this)."""
    if not _ready and _torch_imported() and _cfg is not None:
        _on_torch(_cfg)


def _register() -> None:
    integrations.register(torch_profiler.INTEGRATION)
    integrations.register(gpu.INTEGRATION)


def _apply(cfg) -> None:
    if cfg.torch != "off":
        torch_profiler.install()
    torch_profiler.apply(cfg)
    gpu.apply(cfg)
    distributed.apply(cfg)


def _on_torch(cfg) -> None:
    global _ready
    _ready = True
    _remove_watcher()
    _register()
    _apply(cfg)


def _remove_watcher() -> None:
    try:
        sys.meta_path.remove(_WATCHER)
    except ValueError:
        pass


class _Loader:
    """torch's own loader, plus a callback once torch's module has run."""

    def __init__(self, real) -> None:
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._real.exec_module(module)
        finally:   # torch keeps its real loader, as if we had never been there
            module.__loader__ = self._real
            if getattr(module, "__spec__", None) is not None and module.__spec__.loader is self:
                module.__spec__.loader = self._real
        try:
            if _cfg is not None:
                _on_torch(_cfg)
        except Exception as e:   # never fail the user's import of torch
            callsite.warn(f"instrument: torch integration not installed: {e}")


class _Watcher:
    """A sys.meta_path finder that finds nothing but the moment torch is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module") and not isinstance(spec.loader, _Loader):
            spec.loader = _Loader(spec.loader)
        return spec


_WATCHER = _Watcher()
