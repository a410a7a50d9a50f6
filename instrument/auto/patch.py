"""Wrapping a method of one object (never its class) and putting back exactly what was there."""
from __future__ import annotations

from typing import Any, Callable, List

_MISSING = object()


def _unwrapped(inner: Callable) -> Callable:
    return inner


class Wrapper:
    """A callable installed as an object's attribute in place of `inner`, the callable it wraps.
    A copy or a pickle of the object gets `inner` back: the copy works, uninstrumented, on its own state."""
    __slots__ = ("inner",)

    def __init__(self, inner: Callable) -> None:
        self.inner = inner

    def __reduce__(self):
        return _unwrapped, (self.inner,)


class Patch:
    """`obj.<attr>` replaced by `wrapper` (whose inner is what `obj.<attr>` was)."""
    __slots__ = ("obj", "attr", "wrapper", "before")

    def __init__(self, obj: Any, attr: str, wrapper: Wrapper) -> None:
        if not hasattr(obj, "__dict__"):
            raise TypeError(f"cannot instrument {type(obj).__name__}.{attr}: the object keeps no attributes of its own")
        self.obj, self.attr, self.wrapper = obj, attr, wrapper
        self.before = obj.__dict__.get(attr, _MISSING)
        setattr(obj, attr, wrapper)

    def undo(self) -> None:
        """Put back what was there; a wrapper installed over this one since keeps working, now over what was."""
        current = self.obj.__dict__.get(self.attr, _MISSING)
        if current is self.wrapper:
            if self.before is _MISSING:
                delattr(self.obj, self.attr)
            else:
                setattr(self.obj, self.attr, self.before)
            return
        while isinstance(current, Wrapper):
            if current.inner is self.wrapper:
                current.inner = self.wrapper.inner
                return
            current = current.inner


def installed(obj: Any, attr: str, kind: type) -> bool:
    """Whether a wrapper of `kind` is among those installed as `obj.<attr>`."""
    current = getattr(obj, "__dict__", {}).get(attr)
    while isinstance(current, Wrapper):
        if isinstance(current, kind):
            return True
        current = current.inner
    return False


class Handle:
    """What one instrumenting call installed; `remove()` puts every wrapped method back (also as a context manager)."""

    def __init__(self, what: str, patches: List[Patch]) -> None:
        self.what = what
        self._patches = patches

    @property
    def active(self) -> bool:
        return bool(self._patches)

    def remove(self) -> None:
        while self._patches:
            self._patches.pop().undo()

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<instrument handle: {self.what}{'' if self._patches else ', removed'}>"
