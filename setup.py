"""Build of the compiled hot path, ``instrument._native``.

The NVTX v3 headers come from the ``nvidia-nvtx`` wheel (a build requirement);
when they cannot be found the extension is built without NVTX emission.
"""
import glob
import os
import sys

from setuptools import Extension, setup


def nvtx_include_dir():
    for entry in sys.path:
        for header in glob.glob(os.path.join(entry, "nvidia", "*", "include", "nvtx3", "nvToolsExt.h")) + \
                glob.glob(os.path.join(entry, "nvidia", "nvtx", "include", "nvtx3", "nvToolsExt.h")):
            return os.path.dirname(os.path.dirname(header))
    return None


sources = sorted(glob.glob("csrc/*.c"))
include_dirs = ["csrc"]
define_macros = []
nvtx_inc = nvtx_include_dir()
if nvtx_inc:
    include_dirs.append(nvtx_inc)
    define_macros.append(("INSTRUMENT_HAVE_NVTX", "1"))

extra_compile_args = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
extra_compile_args += os.environ.get("INSTRUMENT_CFLAGS", "").split()
extra_link_args = ["-ldl"] + os.environ.get("INSTRUMENT_LDFLAGS", "").split()

setup(
    ext_modules=[
        Extension(
            "instrument._native",
            sources=sources,
            depends=sorted(glob.glob("csrc/*.h")),   # rebuilt when a header changes; shipped in the sdist
            include_dirs=include_dirs,
            define_macros=define_macros,
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
            optional=os.environ.get("INSTRUMENT_REQUIRE_NATIVE", "0") != "1",
        )
    ]
)
