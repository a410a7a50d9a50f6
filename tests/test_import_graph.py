"""The house's shape, read from the source with `ast` (imports inside functions
count too): no import circle, the model a leaf, layers that import one way (live
-> snapshot <- analysis <- exporters <- serve <- facade and command line), the
live side reached only by the facades (instrument, instrument.distributed) and the
command line, every environment variable of the package read in config.py."""
import ast
import os

import instrument

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "instrument")


def modules():
    """module name -> (path, is_package)"""
    out = {}
    for d, _, files in os.walk(PKG):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].split(os.sep)
            pkg = rel[-1] == "__init__"
            out[".".join(rel[:-1] if pkg else rel)] = (os.path.join(d, f), pkg)
    return out


MODS = modules()
COMPILED = {"instrument._native"}   # the C extension: a module, though not a .py file


def _resolve(mod, is_pkg, node):
    base = mod if is_pkg else mod.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return ".".join(p for p in (base, node.module) if p) if node.level else node.module


def imports(mod):
    path, is_pkg = MODS[mod]
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(mod, is_pkg, node)
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.add(sub if sub in MODS or sub in COMPILED else target)
    return {m for m in found if m in MODS or m in COMPILED}


GRAPH = {m: imports(m) - {m} for m in MODS}


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    assert "instrument.snapshot" in GRAPH["instrument"]
    assert "instrument.live.collector" in GRAPH["instrument.live.capture"]
    assert GRAPH["instrument.live.backend"] >= {"instrument.config", "instrument.live.pure", "instrument._native"}


def test_no_import_circle():
    assert cycles(GRAPH) == []


def test_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_model_is_a_leaf():
    model = {m for m in GRAPH if m == "instrument.snapshot" or m.startswith("instrument.snapshot.")}
    assert {"instrument.snapshot.model", "instrument.snapshot.schema", "instrument.snapshot.merge"} <= model
    for m in model:
        assert GRAPH[m] - model <= {"instrument.histogram"}, m
    assert "instrument.histogram" in GRAPH["instrument.snapshot.model"]
    assert GRAPH["instrument.histogram"] == set()
    assert GRAPH["instrument.counters"] == set()
    assert GRAPH["instrument.config"] <= {"instrument.counters"}


LAYERS = ("instrument.analysis", "instrument.exporters", "instrument.serve")   # each imports only those before it


def test_analysis_exporters_and_serve_never_import_the_live_side():
    for m, deps in GRAPH.items():
        if m.startswith(LAYERS):
            bad = {d for d in deps if d.startswith("instrument.live") or d in ("instrument", "instrument.cli",
                                                                              "instrument._native")}
            assert not bad, f"{m} imports {sorted(bad)}"


def test_the_layers_import_one_way():
    for k, layer in enumerate(LAYERS):
        above = LAYERS[k + 1:] + ("instrument.top",)
        for m, deps in GRAPH.items():
            if m.startswith(layer):
                assert not {d for d in deps if d.startswith(above)}, f"{m} imports from a layer above it"
    assert "instrument.serve.metrics" in GRAPH and GRAPH["instrument.serve.metrics"] >= {
        "instrument.exporters.prometheus", "instrument.serve.multiproc"}


def test_only_the_facade_and_the_command_line_reach_into_the_live_side():
    allowed = {"instrument", "instrument.distributed", "instrument.cli", "instrument._bootstrap.sitecustomize"}
    for m, deps in GRAPH.items():
        if m in allowed or m.startswith("instrument.live"):
            continue
        bad = {d for d in deps if d.startswith("instrument.live")}
        assert not bad, f"{m} imports {sorted(bad)}"


def test_environment_variables_are_read_in_config_only():
    allowed = {os.path.join(PKG, "config.py"), os.path.join(PKG, "_bootstrap", "sitecustomize.py")}
    offenders = [os.path.relpath(p, ROOT) for p, _ in MODS.values()
                 if p not in allowed and "INSTRUMENT_" in open(p).read()]
    assert offenders == []
    named = {os.path.relpath(p, ROOT) for p, _ in MODS.values() for node in ast.walk(ast.parse(open(p).read()))
             if isinstance(node, ast.Constant) and node.value == "PROMETHEUS_MULTIPROC_DIR"}
    assert named == {os.path.join("instrument", "config.py")}


def reads_environment(path):
    """Whether a module touches os.environ or os.getenv (or imports them from os)."""
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                {a.name for a in node.names} & {"environ", "getenv"}:
            return True
    return False


def test_what_serves_reads_no_environment():
    assert reads_environment(os.path.join(PKG, "config.py"))
    for m, (path, _) in MODS.items():
        if m.startswith(LAYERS):
            assert not reads_environment(path), m


# The integrations users import as modules (instrument.asgi, ...): the facade's lazily imported submodules.
AUTO_MODULES = {module for module, attr in instrument._AUTO.values() if attr is None}


def test_instrumentation_without_code_edits_builds_on_the_facade_only():
    auto = {m for m in GRAPH if m.startswith("instrument.auto")} | AUTO_MODULES
    assert {"instrument.auto.modules", "instrument.auto.http"} <= auto and AUTO_MODULES <= set(GRAPH)
    assert "instrument.asgi" in AUTO_MODULES and "instrument.auto.http" in GRAPH["instrument.asgi"]
    for m in auto:
        bad = GRAPH[m] - auto - {"instrument"}
        assert not bad, f"{m} imports {sorted(bad)}"
    assert not GRAPH["instrument"] & auto   # imported on first use (instrument.__getattr__), never with the facade
    for m, deps in GRAPH.items():           # the package itself never builds on them
        assert m in auto or not deps & auto, f"{m} imports {sorted(deps & auto)}"
