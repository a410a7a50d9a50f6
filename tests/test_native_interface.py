"""instrument/_native.pyi declares exactly what the compiled module exports."""
import ast
from pathlib import Path

import pytest

import instrument

_native = pytest.importorskip("instrument._native")

STUB = Path(instrument.__file__).with_name("_native.pyi")


def public(names):
    return {n for n in names if not n.startswith("_")}


def declared(body):
    """Names bound by the statements of a module or class body in a stub."""
    out = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


@pytest.fixture(scope="module")
def stub():
    return ast.parse(STUB.read_text(), filename=str(STUB))


def test_every_export_is_declared(stub):
    missing = public(dir(_native)) - public(declared(stub.body))
    assert not missing, f"exported by instrument._native but not declared in {STUB.name}: {sorted(missing)}"


def test_every_declaration_is_exported(stub):
    extra = public(declared(stub.body)) - public(dir(_native))
    assert not extra, f"declared in {STUB.name} but not exported by instrument._native: {sorted(extra)}"


# what the C extension alone has: the perf group type, NVTX emission (live/nvtx.py emits for the fallback), the
# asyncio runners (task attribution), the perf mmap decoders and a signal's wake-up of a watcher thread
NATIVE_ONLY = {"CounterGroup", "step_runner", "iteration_runner", "ready_runner", "stepped", "memory_status",
               "memory_reset_seen", "sigwake_chain", "sigwake_fd"}


def test_the_fallback_implements_the_declared_subset(stub):
    """instrument.live.pure has every declared name but the native-only ones, with the same members on its classes,
    and names what it lacks."""
    from instrument.live import pure
    subset = {n for n in public(declared(stub.body)) if not n.startswith("nvtx_")} - NATIVE_ONLY
    assert subset - public(dir(pure)) == set(), "declared in the stub, missing from the fallback"
    assert not NATIVE_ONLY & public(dir(pure)), "the fallback must not pretend to have what it lacks"
    for cls in (n for n in stub.body if isinstance(n, ast.ClassDef) and n.name in subset):
        if cls.name.startswith("_"):
            continue
        assert public(declared(cls.body)) <= public(dir(getattr(pure, cls.name))), cls.name
    assert "estimates" in pure.MISSING and "overhead budget" in pure.MISSING


def typed_dicts(stub):
    """The stub's TypedDicts: {name: [fields declared]} (rows the module builds, not types it exports)."""
    out = {}
    for n in stub.body:
        if isinstance(n, ast.ClassDef) and any(getattr(b, "id", None) in ("TypedDict", *out) for b in n.bases):
            out[n.name] = [f.target.id for f in n.body if isinstance(f, ast.AnnAssign)]
    return out


def test_class_members_match(stub):
    rows = typed_dicts(stub)
    classes = [n for n in stub.body if isinstance(n, ast.ClassDef) and n.name not in rows]
    assert classes
    for cls in classes:
        runtime = getattr(_native, cls.name)
        assert isinstance(runtime, type), f"{cls.name} is declared as a class but is {type(runtime).__name__}"
        exported = public(dir(runtime)) - public(dir(object))
        stubbed = public(declared(cls.body))
        assert exported == stubbed, (f"{cls.name}: missing from the stub {sorted(exported - stubbed)}, "
                                     f"not on the type {sorted(stubbed - exported)}")


def test_collect_rows_are_the_declared_typed_dicts(stub, backend):
    """Both backends' collect() give exactly the fields _native.pyi declares (the seam the collector reads)."""
    rows = typed_dicts(stub)
    instrument.configure(counters="task-clock,page-faults", overhead_budget=None)
    with instrument.stage("outer"):
        with instrument.stage("inner"):
            instrument.add("tokens", 3)
    raw = backend.collect()
    assert set(raw) <= set(rows["_CollectResult"]) and set(raw) >= {"nodes", "stats", "tasks", "clock_ns"}
    assert len(raw["stats"]) == 2
    counter_row = rows["_EstimateRow"] + rows["_CounterRow"]   # _CounterRow extends _EstimateRow
    for row in raw["stats"]:
        assert sorted(row) == sorted(rows["_StatsRow"])
        assert sorted(row["estimates"]) == sorted(rows["_Estimates"])
        assert sorted(row["estimates"]["cpu"]) == sorted(rows["_EstimateRow"])
        assert len(row["counters"]) == 2
        for c in row["counters"]:
            assert sorted(c) == sorted(counter_row)
    assert sorted(backend.calibrate(20)) == sorted(rows["_Calibration"])


def test_every_hot_option_reaches_both_backends(stub, backend):
    """An option config.py marks hot is taken by configure() and given back by configuration() on both backends,
    under its own name; the stub declares the same set."""
    from instrument import config
    hot = {o.name for o in config.OPTIONS if o.hot}
    assert hot == set(typed_dicts(stub)["_Configuration"])
    values = config.hot_values(config.defaults().replace(max_stages=321, trace_events=7, exemplars=5,
                                                          overhead_budget=0.25, cpu_split=False))
    backend.configure(**values)
    got = backend.configuration()
    assert set(got) == hot
    for k in ("max_stages", "trace_events", "exemplars", "overhead_budget", "cpu_split", "enabled", "cpu_clock"):
        assert got[k] == values[k], k
    with pytest.raises(TypeError, match="unknown option 'budget'"):
        backend.configure(budget=0.1)
    with pytest.raises(ValueError, match="max_stages must be an integer from 1"):
        backend.configure(max_stages=0, exemplars=3)
    assert backend.configuration()["exemplars"] == 5, "a refused call changes nothing"
