"""Warnings that point at the user's code: the first frame outside this package
(and outside the import machinery) is where the warning is reported."""
from __future__ import annotations

import os
import sys
import warnings
from typing import Type

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _import_machinery(filename: str) -> bool:
    """Frames warnings.warn itself skips when it counts `stacklevel`."""
    return "importlib" in filename and "_bootstrap" in filename


def _ours(filename: str) -> bool:
    return filename.startswith(_PACKAGE) or _import_machinery(filename)


def stacklevel(skip: int = 1) -> int:
    """The `stacklevel` for warnings.warn called `skip` frames below the caller of this
    function that names the first frame outside the package (2, the caller's caller,
    when every frame is ours)."""
    level = skip + 1
    f = sys._getframe(skip + 1)
    while f is not None and _ours(f.f_code.co_filename):
        if not _import_machinery(f.f_code.co_filename):
            level += 1
        f = f.f_back
    return level if f is not None else skip + 1


def warn(message: str, category: Type[Warning] = RuntimeWarning) -> None:
    """warnings.warn at the user's call site; never raises (an `error` filter included)."""
    try:
        warnings.warn(message, category, stacklevel=stacklevel(1))
    except Exception:
        pass
