"""Capture windows (instrument.capture / capture_every): one NVTX range after the
warm-up, checked with a real NVTX injection tool; names and warm-ups from the options."""
import textwrap
import warnings

import pytest

from nvtx_support import nvtx_include_dir, run_python, run_recorded, start_end_pairs

import instrument
import instrument.live.capture
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


@pytest.fixture(autouse=True)
def _fresh_captures():
    instrument.live.capture._reset_captures()
    yield
    instrument.live.capture._reset_captures()


def _capture_position(recs, name="steady"):
    """Index of the capture range's start and end in recs, and the record."""
    (start, end), = start_end_pairs(recs, "instrument").values()
    assert start.message == name
    return recs.index(start), recs.index(end), start


@needs_tool
@pytest.mark.parametrize("fallback", [False, True], ids=["native", "fallback"])
def test_capture_with_block_opens_once_after_warmup(fallback):
    if not fallback and not HAS_NATIVE_NVTX:
        pytest.skip("instrument._native built without NVTX")
    recs = run_recorded((FORCE_FALLBACK if fallback else "") + child("""
        import instrument
        import instrument.live.nvtx as inv
        for i in range(30):
            with instrument.capture("steady", warmup=20):
                inv.push(f"it{i}"); inv.pop()
    """))
    s, e, start = _capture_position(recs)
    pushes = [r for r in recs if r.is_push]
    before = {r.message for r in pushes if recs.index(r) < s}
    inside = {r.message for r in pushes if s < recs.index(r) < e}
    assert before == {f"it{i}" for i in range(20)}
    assert inside == {f"it{i}" for i in range(20, 30)}
    assert e == len(recs) - 1                        # closed at interpreter exit
    cmd = nsys.build_command(["python", "serve.py"])
    assert cmd[cmd.index("-p") + 1] == f"{start.message}@{start.domain}" == "steady@instrument"
    assert start.color == inv.color_for("steady")


@needs_native
@needs_tool
def test_capture_every_decorator_with_iterations():
    recs = run_recorded(child("""
        import instrument
        import instrument.live.nvtx as inv
        @instrument.capture_every("window", warmup=3, iterations=5)
        def handle(i):
            inv.push(f"req{i}"); inv.pop()
        for i in range(12):
            handle(i)
    """))
    s, e, _ = _capture_position(recs, "window")
    inside = [r.message for r in recs[s:e] if r.is_push]
    assert inside == [f"req{i}" for i in range(3, 8)]


@needs_native
@needs_tool
def test_capture_step_and_env_defaults():
    recs = run_recorded(child("""
        import instrument
        import instrument.live.nvtx as inv
        cap = instrument.capture_every(iterations=2)          # name and warmup from the environment
        for i in range(8):
            cap.step()
            inv.push(f"it{i}"); inv.pop()
        print(cap.name, cap.warmup)
    """), env={"INSTRUMENT_CAPTURE": "win", "INSTRUMENT_WARMUP": "4"})
    assert recs.stdout.split() == ["win", "4"]
    s, e, _ = _capture_position(recs, "win")
    assert [r.message for r in recs[s:e] if r.is_push] == ["it4", "it5"]


@needs_native
@needs_tool
def test_capture_async_decorator_spans_tasks():
    # 50 concurrent calls: entries and exits are counted across tasks, so the window opens as
    # call 6 enters and closes as the 25th call to finish exits, whichever task that is
    recs = run_recorded(child("""
        import asyncio
        import instrument
        import instrument.live.nvtx as inv
        @instrument.capture_every("steady", warmup=5, iterations=20)
        async def handle(i):
            inv.push(f"enter{i}"); inv.pop()
            await asyncio.sleep(0.001 * (i % 3))
            inv.push(f"exit{i}"); inv.pop()
        async def main():
            await asyncio.gather(*(handle(i) for i in range(50)))
        asyncio.run(main())
    """))
    s, e, _ = _capture_position(recs)
    marks = [(k, r.message) for k, r in enumerate(recs) if r.is_push]
    entered_before = [m for k, m in marks if k < s and m.startswith("enter")]
    assert entered_before == [f"enter{i}" for i in range(5)]
    assert recs[s + 1].message == "enter5"                 # the sixth call's own range follows the window's start
    assert len([m for k, m in marks if k < e and m.startswith("exit")]) == 25
    assert len([m for k, m in marks if k > e and m.startswith("exit")]) == 25


@needs_native
@needs_tool
def test_capture_profiler_api_calls_torch_only_when_cuda_is_initialised():
    recs = run_recorded(child("""
        import sys, types
        calls = []
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(is_initialized=lambda: True, profiler=types.SimpleNamespace(
            start=lambda: calls.append("start"), stop=lambda: calls.append("stop")))
        sys.modules["torch"] = torch
        import instrument
        import instrument.live.nvtx as inv
        for i in range(4):
            with instrument.capture("steady", warmup=1, iterations=2, profiler_api=True):
                pass
        print(*calls)
    """))
    assert recs.stdout.split() == ["start", "stop"]
    _capture_position(recs)


def test_capture_profiler_api_never_imports_torch():
    out = run_python(child("""
        import sys
        import instrument
        import instrument.live.nvtx as inv
        for i in range(3):
            with instrument.capture("steady", warmup=1, profiler_api=True):
                pass
        instrument.live.capture.close_all()
        print("torch" in sys.modules)
    """))
    assert out.stdout.strip() == "False"


def test_capture_argument_errors():
    with pytest.raises(ValueError, match="warmup"):
        instrument.capture("x", warmup=-1)
    with pytest.raises(ValueError, match="warmup"):
        instrument.capture("x", warmup=1.5)
    with pytest.raises(ValueError, match="iterations"):
        instrument.capture_every("x", iterations=0)
    with pytest.raises(TypeError, match="name"):
        instrument.capture("")
    with pytest.raises(TypeError, match="profiler_api"):
        instrument.capture("x", profiler_api="yes")
    instrument.capture("same", warmup=2)
    assert instrument.capture("same", warmup=2) is instrument.capture("same", warmup=2)
    with pytest.raises(ValueError, match="already exists"):
        instrument.capture("same", warmup=3)


def test_capture_internal_failure_warns_once(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("emitter broke")
    monkeypatch.setattr(inv, "start", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(10):
            with instrument.capture("broken", warmup=1):
                pass
            instrument.capture("broken", warmup=1).close()
    assert [str(w.message) for w in caught] == ["instrument: NVTX capture 'broken': RuntimeError('emitter broke')"]
    assert instrument.capture("broken", warmup=1).state == "failed"


def test_capture_defaults_are_the_options_in_force():
    assert instrument.capture().name == "steady"
    assert instrument.capture().warmup == 0 and instrument.capture_every("other").warmup == 20   # warmup unset
    instrument.configure(capture="xyz", warmup=7)
    assert (instrument.capture().name, instrument.capture().warmup) == ("xyz", 7)
    assert instrument.capture_every("third").warmup == 7
    assert instrument.capture("fourth", warmup=2).warmup == 2      # an argument beats the option
    with pytest.raises(ValueError, match="warmup must be an integer 0 or more"):
        instrument.configure(warmup=-1)
    with pytest.raises(ValueError, match="capture must be a non-empty string"):
        instrument.configure(capture="")


def test_bad_warmup_variable_is_reported_and_ignored():
    out = run_python(child("""
        import instrument
        print(instrument.capture().name, instrument.capture().warmup)
    """), env={"INSTRUMENT_CAPTURE": "win", "INSTRUMENT_WARMUP": "lots"})
    assert out.stdout.split() == ["win", "0"]
    assert "INSTRUMENT_WARMUP must be an integer 0 or more, got 'lots'; using the default" in out.stderr


def test_capture_counting_rules_in_process(monkeypatch):
    events = []
    monkeypatch.setattr(inv, "start", lambda name, color: events.append(("start", name)) or 42)
    monkeypatch.setattr(inv, "end", lambda rid: events.append(("end", rid)))
    cap = instrument.capture_every("rules", warmup=2, iterations=3)
    for i in range(10):
        with cap:
            events.append(i)
    assert events == [0, 1, ("start", "rules"), 2, 3, 4, ("end", 42), 5, 6, 7, 8, 9]
    cap.close()
    assert events[-1] == 9 and cap.state == "closed"
