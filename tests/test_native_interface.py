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


def test_class_members_match(stub):
    classes = [n for n in stub.body if isinstance(n, ast.ClassDef)]
    assert classes
    for cls in classes:
        runtime = getattr(_native, cls.name)
        assert isinstance(runtime, type), f"{cls.name} is declared as a class but is {type(runtime).__name__}"
        exported = public(dir(runtime)) - public(dir(object))
        stubbed = public(declared(cls.body))
        assert exported == stubbed, (f"{cls.name}: missing from the stub {sorted(exported - stubbed)}, "
                                     f"not on the type {sorted(stubbed - exported)}")
