"""`instrument.modules(model)`: every submodule's forward, down to a depth, a stage named by its qualified path."""
from __future__ import annotations

import fnmatch
from typing import Any, Callable, Iterable, List, Optional, Tuple, Union

import instrument

from .patch import Handle, Patch, Wrapper, installed


class ModuleForward(Wrapper):
    """A module's forward inside its stage.  While torch.compile traces it, the stage is left out: the
    compiler sees the plain forward and builds the same graph, without a break."""
    __slots__ = ("stage", "compiling")

    def __init__(self, stage: Any, inner: Callable, compiling: Callable[[], bool]) -> None:
        super().__init__(inner)
        self.stage, self.compiling = stage, compiling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiling():
            return self.inner(*args, **kwargs)
        with self.stage:
            return self.inner(*args, **kwargs)


def _patterns(include: Union[None, str, Iterable[str]]) -> Tuple[str, ...]:
    if include is None:
        return ()
    if isinstance(include, str):
        return (include,)
    try:
        patterns = tuple(include)
    except TypeError:
        patterns = None
    if patterns is None or not all(isinstance(p, str) and p for p in patterns):
        raise TypeError(f"include must be a glob of qualified module names (e.g. 'encoder.layer.*.attention') "
                        f"or a list of them, not {include!r}")
    return patterns


def selected(root: Any, depth: Optional[int], include: Tuple[str, ...]) -> List[Tuple[str, Any]]:
    """(qualified name, module) of the submodules that get a stage, in `named_modules()` order: those at most
    `depth` levels below `root` and those whose name matches a glob of `include`.  A container that is never
    called itself (ModuleList, ModuleDict: no forward of its own) is no level and gets no stage."""
    import torch
    unimplemented = torch.nn.Module.forward
    out: List[Tuple[str, Any]] = []
    seen = {id(root)}

    def walk(module: Any, prefix: str, level: int) -> None:
        for name, child in module.named_children():
            if child is None or id(child) in seen:   # a module shared under two names is instrumented once
                continue
            seen.add(id(child))
            qualified = prefix + name
            callable_ = type(child).forward is not unimplemented
            below = level + 1 if callable_ else level
            if callable_ and ((depth is None or below <= depth) or any(fnmatch.fnmatchcase(qualified, p)
                                                                       for p in include)):
                out.append((qualified, child))
            if include or depth is None or below < depth or not callable_:
                walk(child, qualified + ".", below)
    walk(root, "", 0)
    return out


def modules(model: Any, depth: Optional[int] = 2, include: Union[None, str, Iterable[str]] = None,
            name: Optional[str] = None) -> Handle:
    """Time `model`'s forward and each submodule's down to `depth` levels (None: all), or whose qualified
    name matches a glob of `include`, as stages named by their qualified path (`encoder.layer.0`); the model's
    own stage is `name` (default: its class name).  They nest as the calls do, under whatever stage is open.
    Returns a handle whose `remove()` puts every forward back as it was."""
    import torch
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"instrument.modules needs a torch.nn.Module, not {type(model).__name__}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise ValueError(f"depth must be a whole number of levels (0: the model alone) or None for all, not {depth!r}")
    patterns = _patterns(include)
    inner = getattr(model, "_orig_mod", model)   # torch.compile's wrapper: the submodules are the model's own
    if name is None:
        name = type(inner).__name__
    elif not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, not {name!r}")
    targets = [(name, model)] + selected(inner, depth, patterns)
    for qualified, module in targets:
        if installed(module, "forward", ModuleForward):
            raise RuntimeError(f"{qualified} ({type(module).__name__}) is instrumented already: call remove() on the "
                               "handle instrument.modules returned before instrumenting it again")
    compiling = torch.compiler.is_compiling
    patches = [Patch(module, "forward", ModuleForward(instrument.stage(qualified), module.forward, compiling))
               for qualified, module in targets]
    return Handle(f"{len(patches)} modules of {name}", patches)
