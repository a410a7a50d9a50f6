"""Run Python code under the recording NVTX injection tool (tests/nvtx_tool/recorder.c).

NVTX loads its tool once per process, at the first NVTX call, so every recorded
scenario runs in a fresh interpreter: ``run_recorded(code)`` returns the calls it made.
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Optional

REPO = Path(__file__).resolve().parent.parent
RECORDER_SOURCE = Path(__file__).resolve().parent / "nvtx_tool" / "recorder.c"
NO_TOOL = "./."  # NVTX_INJECTION64_PATH value that NVTX reads as "load no tool at all"


def nvtx_include_dir() -> Optional[str]:
    """Directory holding nvtx3/nvToolsExt.h from the nvidia-nvtx wheel, or None."""
    for entry in sys.path:
        for header in glob.glob(os.path.join(entry or ".", "nvidia", "*", "include", "nvtx3", "nvToolsExt.h")):
            return os.path.dirname(os.path.dirname(header))
    return None


@lru_cache(maxsize=None)
def build_recorder() -> str:
    """Compile recorder.c once (cached by source hash across sessions); returns the .so path."""
    include = nvtx_include_dir()
    if include is None:
        raise RuntimeError("NVTX headers not found: install the nvidia-nvtx wheel")
    source = RECORDER_SOURCE.read_bytes()
    key = hashlib.sha256(source + include.encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"instrument-nvtx-recorder-{os.getuid()}"
    cache.mkdir(exist_ok=True)
    lib = cache / f"librecorder-{key}.so"
    if not lib.exists():
        tmp = cache / f".{lib.name}.{os.getpid()}"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-I", include,
             str(RECORDER_SOURCE), "-o", str(tmp), "-lpthread"],
            check=True, capture_output=True, text=True,
        )
        os.replace(tmp, lib)  # atomic: parallel sessions never see a half-written library
    return str(lib)


@dataclass(frozen=True)
class Record:
    tid: int
    call: str            # NVTX API name, e.g. "nvtxDomainRangePushEx"
    domain: str          # "" for the default domain
    message: str         # resolved text ("" when none)
    color: Optional[int]  # ARGB, None when the colour type was not ARGB
    category: int
    id: Optional[int]    # range id (start/end), depth (push/pop), else None

    @property
    def is_push(self) -> bool:
        return self.call in ("nvtxDomainRangePushEx", "nvtxRangePushEx")

    @property
    def is_pop(self) -> bool:
        return self.call in ("nvtxDomainRangePop", "nvtxRangePop")

    @property
    def is_start(self) -> bool:
        return self.call in ("nvtxDomainRangeStartEx", "nvtxRangeStartEx")

    @property
    def is_end(self) -> bool:
        return self.call in ("nvtxDomainRangeEnd", "nvtxRangeEnd")


class Records(list):
    """The recorded calls, in order; ``.stdout`` holds what the child printed."""
    stdout: str = ""


def _unescape(s: str) -> str:
    return s.replace("\\\\", "\0").replace("\\t", "\t").replace("\\n", "\n").replace("\0", "\\")


def parse(text: str) -> Records:
    out = Records()
    for line in text.splitlines():
        tid, call, domain, message, color, category, rid = line.split("\t")
        out.append(Record(int(tid), call, _unescape(domain), _unescape(message),
                          int(color, 16) if color else None, int(category), int(rid) if rid else None))
    return out


def run_python(code: str, env: Optional[Mapping[str, Optional[str]]] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter with this checkout importable; raises on failure."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("NVTX_", "INSTRUMENT_"))}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full_env["NVTX_INJECTION64_PATH"] = NO_TOOL
    for k, v in (env or {}).items():  # a None value removes the variable
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"child failed (rc={proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def run_recorded(code: str, env: Optional[Mapping[str, str]] = None, timeout: float = 120) -> Records:
    """Run code in a fresh interpreter with the recorder attached; returns its NVTX calls."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nvtx.tsv")
        proc = run_python(code, {**(env or {}), "NVTX_INJECTION64_PATH": build_recorder(),
                                 "NVTX_RECORD_PATH": path}, timeout)
        records = parse(Path(path).read_text() if os.path.exists(path) else "")
    records.stdout = proc.stdout
    return records


# ---- helpers for assertions ---------------------------------------------------------

def pushpop_paths(records: Iterable[Record], domain: Optional[str] = None) -> list:
    """Replays push/pop per (thread, domain); returns the stack path of every push, in order.

    Raises AssertionError on a pop without a push, or on ranges left open at exit."""
    stacks: dict = {}
    paths = []
    for r in records:
        if domain is not None and r.domain != domain:
            continue
        stack = stacks.setdefault((r.tid, r.domain), [])
        if r.is_push:
            stack.append(r.message)
            paths.append(tuple(stack))
        elif r.is_pop:
            assert stack, f"pop without push on thread {r.tid} domain {r.domain!r}"
            stack.pop()
    open_ = {k: v for k, v in stacks.items() if v}
    assert not open_, f"ranges left open: {open_}"
    return paths


def start_end_pairs(records: Iterable[Record], domain: Optional[str] = None) -> dict:
    """Maps range id -> (start record, end record); asserts every start ends exactly once."""
    starts, pairs = {}, {}
    for r in records:
        if domain is not None and r.domain != domain:
            continue
        if r.is_start:
            assert r.id not in starts, f"range id {r.id} handed out twice"
            starts[r.id] = r
        elif r.is_end:
            assert r.id in starts, f"end of unknown range id {r.id}"
            assert r.id not in pairs, f"range id {r.id} ended twice"
            pairs[r.id] = (starts[r.id], r)
    assert len(pairs) == len(starts), f"ranges never ended: {sorted(set(starts) - set(pairs))}"
    return pairs
