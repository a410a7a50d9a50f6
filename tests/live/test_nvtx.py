"""NVTX emission and nsys commands, checked with a real NVTX injection tool."""
import random
import shlex
import string
import sys
import textwrap

import pytest

from nvtx_support import (build_recorder, nvtx_include_dir, pushpop_paths, run_python, run_recorded,
                          start_end_pairs)

import instrument.live.nvtx as inv
from instrument import nsys

try:
    from instrument import _native
except ImportError:
    _native = None

HAS_NATIVE_NVTX = bool(_native is not None and hasattr(_native, "nvtx_push") and _native.nvtx_available())
needs_native = pytest.mark.skipif(not HAS_NATIVE_NVTX, reason="instrument._native built without NVTX")
needs_tool = pytest.mark.skipif(nvtx_include_dir() is None, reason="NVTX headers (nvidia-nvtx) not installed")
FORCE_FALLBACK = "import sys; sys.modules['instrument._native'] = None\n"  # makes the C import fail


def child(code):
    return textwrap.dedent(code)


def by_call(records, call, domain="instrument"):
    return [r for r in records if r.call == call and r.domain == domain]


# ---- colours ---------------------------------------------------------------------------

def _names():
    rng = random.Random(1234)
    alphabet = string.ascii_letters + string.digits + "._/-: " + "éß漢字🙂"
    names = ["", "a", "b", "tokenize", "model.forward", "postprocess", "steady", "x" * 300]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(2000)]
    return names


@needs_native
def test_color_for_matches_c():
    names = _names()
    assert [inv.color_for(n) for n in names] == [_native.nvtx_color(n) for n in names]


def test_color_for_is_pinned_and_spreads_over_the_palette():
    # Pinned values: a change here changes every user's timeline colours.
    assert inv.color_for("a") == 0xFFF6A600
    assert inv.color_for("steady") == inv.color_for("steady")
    colours = {inv.color_for(n) for n in _names()}
    assert colours == set(inv._PALETTE)
    assert all(c >> 24 == 0xFF for c in colours)
    with pytest.raises(TypeError):
        inv.color_for(b"a")


# ---- the C emitter under the recorder ----------------------------------------------------

@needs_native
@needs_tool
def test_c_domain_once_strings_once_ranges_matched():
    recs = run_recorded(child("""
        from instrument import _native as n
        n.nvtx_init("instrument")
        n.nvtx_init("instrument")          # same name: no second domain
        for i in range(100):
            n.nvtx_push("outer")
            n.nvtx_push("inner", category=3)
            n.nvtx_pop()
            n.nvtx_pop()
        ids = [n.nvtx_range_start("span") for _ in range(50)]
        for i in reversed(ids):
            n.nvtx_range_end(i)
        print(len(set(ids)), min(ids) > 0)
    """))
    assert recs.stdout.split() == ["50", "True"]
    assert [r.message for r in recs if r.call == "nvtxDomainCreateA"] == ["instrument"]
    registered = [r.message for r in by_call(recs, "nvtxDomainRegisterStringA")]
    assert sorted(registered) == ["inner", "outer", "span"]
    paths = pushpop_paths(recs, "instrument")
    assert paths == [("outer",), ("outer", "inner")] * 100
    pushes = [r for r in recs if r.is_push]
    assert all(r.color == inv.color_for(r.message) for r in pushes)
    assert {r.category for r in pushes if r.message == "inner"} == {3}
    pairs = start_end_pairs(recs, "instrument")
    assert len(pairs) == 50
    assert all(s.message == "span" and s.color == inv.color_for("span") for s, _ in pairs.values())


@needs_native
@needs_tool
def test_c_push_pop_balanced_per_thread():
    recs = run_recorded(child("""
        import threading
        from instrument import _native as n
        n.nvtx_init("instrument")
        barrier = threading.Barrier(8)
        tids = []
        def work(k):
            tids.append(threading.get_native_id())
            barrier.wait()                      # all 8 emit at the same time
            for i in range(200):
                n.nvtx_push(f"t{k}")
                n.nvtx_push("step")
                n.nvtx_push("leaf", color=0xFF00FF00)
                n.nvtx_pop(); n.nvtx_pop(); n.nvtx_pop()
        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(*tids)
    """))
    tids = {int(t) for t in recs.stdout.split()}
    assert len(tids) == 8
    for tid in tids:
        mine = [r for r in recs if r.tid == tid]
        paths = pushpop_paths(mine, "instrument")  # asserts balance on this thread
        k = paths[0][0]
        assert paths == [(k,), (k, "step"), (k, "step", "leaf")] * 200
    assert {r.color for r in recs if r.is_push and r.message == "leaf"} == {0xFF00FF00}
    assert sorted(r.message for r in by_call(recs, "nvtxDomainRegisterStringA")) == \
        sorted([f"t{k}" for k in range(8)] + ["step", "leaf"])


@needs_native
@needs_tool
def test_c_start_end_across_threads():
    recs = run_recorded(child("""
        import threading
        from instrument import _native as n
        ids = [n.nvtx_range_start("req") for _ in range(20)]
        t = threading.Thread(target=lambda: [n.nvtx_range_end(i) for i in ids])
        t.start(); t.join()
    """))
    pairs = start_end_pairs(recs, "instrument")
    assert len(pairs) == 20
    assert all(s.tid != e.tid for s, e in pairs.values())


@needs_native
@needs_tool
def test_colours_stable_across_processes():
    code = child("""
        from instrument import _native as n
        for name in ["tokenize", "forward", "decode", "postprocess", "é漢"]:
            n.nvtx_push(name); n.nvtx_pop()
    """)
    first, second = ({r.message: r.color for r in run_recorded(code) if r.is_push} for _ in range(2))
    assert first == second == {m: inv.color_for(m) for m in first}


@needs_native
@needs_tool
def test_categories_named():
    recs = run_recorded(child("""
        from instrument import _native as n
        n.nvtx_init("instrument")
        n.nvtx_name_category(7, "io")
        n.nvtx_push("read", category=7); n.nvtx_pop()
    """))
    named = by_call(recs, "nvtxDomainNameCategoryA")
    assert [(r.category, r.message) for r in named] == [(7, "io")]
    assert [r.category for r in recs if r.is_push] == [7]


@needs_native
@needs_tool
def test_nvtx_package_ranges_seen_and_nest_with_ours():
    recs = run_recorded(child("""
        import nvtx
        from instrument import _native as n
        n.nvtx_init("instrument")
        with nvtx.annotate("request"):                   # default domain
            nvtx.push_range("outer", domain="instrument")
            n.nvtx_push("ours")
            with nvtx.annotate("theirs", domain="instrument"):
                pass
            n.nvtx_pop()
            nvtx.pop_range(domain="instrument")
    """))
    assert pushpop_paths(recs, "instrument") == [("outer",), ("outer", "ours"), ("outer", "ours", "theirs")]
    assert pushpop_paths(recs, "") == [("request",)]
    # Timeline order: the default-domain range encloses everything in ours.
    order = [(r.domain, r.message if r.is_push else "pop") for r in recs if r.is_push or r.is_pop]
    assert order[0] == ("", "request") and order[-1] == ("", "pop")
    # Both NVTX copies (ours and the package's) got the same domain from the tool.
    assert {r.message for r in recs if r.call == "nvtxDomainCreateA"} == {"instrument"}


# ---- the Python module and its fallback ------------------------------------------------------

@needs_tool
def test_fallback_emitter_through_nvtx_package():
    recs = run_recorded(FORCE_FALLBACK + child("""
        import instrument.live.nvtx as inv
        assert inv.backend() == "nvtx", inv.backend()
        inv.init("instrument")
        inv.name_category(4, "compute")
        for _ in range(10):
            inv.push("a"); inv.push("b", category=4); inv.pop(); inv.pop()
        rid = inv.start("s", color=0xFF112233)
        inv.end(rid)
        print(rid)
    """))
    assert int(recs.stdout) > 0
    assert pushpop_paths(recs, "instrument") == [("a",), ("a", "b")] * 10
    assert all(r.color == inv.color_for(r.message) for r in recs if r.is_push)
    assert sorted(r.message for r in by_call(recs, "nvtxDomainRegisterStringA")) == ["a", "b", "s"]
    (start, end), = start_end_pairs(recs, "instrument").values()
    assert (start.message, start.color, end.id) == ("s", 0xFF112233, int(recs.stdout))
    (named,) = by_call(recs, "nvtxDomainNameCategoryA")
    assert named.message == "compute"
    assert {r.category for r in recs if r.is_push and r.message == "b"} == {named.category}


@needs_native
@needs_tool
def test_module_functions_use_c_backend():
    recs = run_recorded(child("""
        import instrument.live.nvtx as inv
        assert inv.backend() == "native"
        inv.init("svc")
        inv.push("x"); inv.pop()
    """))
    assert pushpop_paths(recs, "svc") == [("x",)]


@pytest.mark.parametrize("variant", ["native", "fallback", "none"])
@pytest.mark.parametrize("tool_env", [{}, {"NVTX_INJECTION64_PATH": None}], ids=["no-tool", "unset"])
def test_everything_runs_without_a_tool(variant, tool_env):
    prefix = {"native": "", "fallback": FORCE_FALLBACK,
              "none": FORCE_FALLBACK + "sys.modules['nvtx'] = None\n"}[variant]
    out = run_python(prefix + child("""
        import asyncio, nvtx
        import instrument
        import instrument.live.nvtx as inv
        inv.init("instrument")
        inv.name_category(1, "c")
        inv.push("a"); inv.pop()
        inv.end(inv.start("b"))
        for i in range(5):
            with instrument.capture("steady", warmup=2):
                pass
        @instrument.capture_every("dec", warmup=1, iterations=2)
        async def handle():
            await asyncio.sleep(0)
        asyncio.run(handle())
        print(inv.backend(), instrument.capture("steady", warmup=2).state)
    """) if variant != "none" else prefix + child("""
        import instrument
        import instrument.live.nvtx as inv
        inv.push("a"); inv.pop(); inv.end(inv.start("b"))
        with instrument.capture("steady"):
            pass
        print(inv.backend(), instrument.capture("steady").state)
    """), env=tool_env)
    backend, state = out.stdout.split()
    assert backend == {"native": "native" if HAS_NATIVE_NVTX else "nvtx", "fallback": "nvtx", "none": "none"}[variant]
    assert state == "open"
    assert not out.stderr



# ---- nsys command ----------------------------------------------------------------------

def test_build_command_default():
    assert nsys.build_command(["python", "serve.py", "--port", "8000"]) == [
        "nsys", "profile", "-t", "cuda,nvtx,osrt", "-c", "nvtx", "-p", "steady@instrument",
        "--capture-range-end=stop", "--", "python", "serve.py", "--port", "8000"]


def test_build_command_options():
    cmd = nsys.build_command(["python", "s.py"], capture="win", domain="svc", output="out/rep",
                             trace="cuda,nvtx", capture_range_end="repeat:3", extra=["--sample=none"],
                             env=nsys.child_env(5, "win"))
    assert cmd == ["nsys", "profile", "-t", "cuda,nvtx", "-c", "nvtx", "-p", "win@svc",
                   "--capture-range-end=repeat:3", "-o", "out/rep",
                   "-e", "INSTRUMENT_CAPTURE=win,INSTRUMENT_WARMUP=5", "--sample=none", "--", "python", "s.py"]
    assert nsys.build_command(["app"], capture=None) == ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--", "app"]


@pytest.mark.parametrize("kwargs,exc,word", [
    ({"argv": "python serve.py"}, TypeError, "argv"),
    ({"argv": []}, TypeError, "argv"),
    ({"capture": "a@b"}, ValueError, "capture"),
    ({"domain": ""}, ValueError, "domain"),
    ({"capture_range_end": "sometimes"}, ValueError, "capture_range_end"),
    ({"trace": ""}, ValueError, "trace"),
    ({"extra": "--x"}, TypeError, "extra"),
    ({"env": {"A": "1,2"}}, ValueError, "env"),
])
def test_build_command_rejects_bad_arguments(kwargs, exc, word):
    kwargs = {"argv": ["python", "serve.py"], **kwargs}
    with pytest.raises(exc, match=word):
        nsys.build_command(**kwargs)


def test_child_env():
    assert nsys.child_env(20, "steady") == {"INSTRUMENT_CAPTURE": "steady", "INSTRUMENT_WARMUP": "20"}
    with pytest.raises(ValueError, match="warmup"):
        nsys.child_env(-1)


def test_run_dry_run_and_missing_nsys(monkeypatch, capsys):
    assert nsys.run(["python", "serve.py"], dry_run=True, warmup=3) == 0
    line = capsys.readouterr().out.strip()
    assert shlex.split(line) == nsys.build_command(["python", "serve.py"], env=nsys.child_env(3, "steady"))
    monkeypatch.setattr(nsys.shutil, "which", lambda name: None)
    assert nsys.run(["python", "my serve.py"]) == 0
    out = capsys.readouterr().out
    assert "nsys is not on PATH" in out and "'my serve.py'" in out


def test_run_invokes_nsys_when_on_path(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "nsys"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert nsys.run([sys.executable, "-c", "pass"], warmup=1) == 3
    args = (tmp_path / "args").read_text().split()
    assert args[:2] == ["profile", "-t"] and "steady@instrument" in args and "INSTRUMENT_WARMUP=1" in args[-5]


@needs_tool
def test_recorder_builds_once():
    assert build_recorder() is build_recorder()
