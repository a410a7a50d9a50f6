"""Installs the torch integrations (profiler ranges, GPU timing, torch.distributed
collectives) once torch is imported, and never imports torch itself.

When instrument is imported or configured, or `instrument.profile()` is called,
with torch already in sys.modules, they are installed at once; otherwise right
after `import torch` has run (importwatch).  With the `torch`, `gpu` and
`collectives` options off nothing is installed.
"""
from __future__ import annotations

import sys

from . import distributed, gpu, hooks, importwatch, integrations, memory, torch_profiler

_ready = False
_cfg = None   # the configuration in force, as the collector last applied it


def _torch_imported() -> bool:
    t = sys.modules.get("torch")
    return t is not None and hasattr(t, "autograd")   # None: import blocked; no autograd: still importing


name = "torch"   # an integration without a key in Snapshot.meta (status() says nothing)


def configure(cfg) -> None:
    """Runs at import and at every configure() (the collector calls every integration's configure)."""
    global _cfg
    _cfg = cfg
    hooks.reinstall()
    if _ready:
        _apply(cfg)
        return
    if cfg.torch == "off" and cfg.gpu == "off" and not cfg.collectives:
        return
    if "on" in (cfg.torch, cfg.gpu):
        _register()   # so meta says why it is not working yet
    if _torch_imported():
        _on_torch(cfg)
    else:
        importwatch.when_imported("torch", lambda: _on_torch(_cfg) if _cfg is not None else None)


def ensure() -> None:
    """Install now if torch is imported (instrument.profile and snapshot call this)."""
    if not _ready and _torch_imported() and _cfg is not None:
        _on_torch(_cfg)


def _register() -> None:
    integrations.register(torch_profiler)
    integrations.register(gpu)


def _apply(cfg) -> None:
    if cfg.torch != "off":
        torch_profiler.install()
    torch_profiler.apply(cfg)
    gpu.apply(cfg)
    memory.apply(cfg)
    distributed.apply(cfg)


def _on_torch(cfg) -> None:
    global _ready
    _ready = True
    importwatch.forget("torch")
    _register()
    _apply(cfg)
