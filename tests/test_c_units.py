"""The C core's shape, read from csrc/ as text: calls between units run one way (no
call circle among the units), and no function is longer than about 80 lines."""
import os
import re

import pytest
from test_import_graph import cycles   # one circle finder for imports and C calls

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
MAX_LINES = 80
# a function definition starts at column 0: a return type, its name, its parameters, the opening brace
DEF = re.compile(r"^(?!static\s+inline\b)(?:static\s+)?(?:const\s+)?[A-Za-z_][\w\s\*]*?\b([A-Za-z_]\w*)\s*\(([^;{]*?)\)\s*\{",
                 re.M | re.S)
INLINE = re.compile(r"^static\s+inline\s+[\w\s\*]*?\b([A-Za-z_]\w*)\s*\([^;{]*?\)\s*\{", re.M | re.S)
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined"}


def _strip(text):
    """Comments and string literals blanked (newlines kept, so line numbers stay)."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def _bodies(text, pattern):
    """(name, first line, body) of each function the pattern finds: the body up to its matching brace."""
    out = []
    for m in pattern.finditer(text):
        depth, k = 0, m.end() - 1
        while k < len(text):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                break
            k += 1
        out.append((m.group(1), text.count("\n", 0, m.start()) + 1, text[m.end():k]))
    return out


def units():
    """unit name -> {function: (first line, last line, body)}; a unit is a .c file with its header's inline
    functions."""
    out = {}
    for f in sorted(os.listdir(CSRC)):
        stem, ext = os.path.splitext(f)
        if ext not in (".c", ".h"):
            continue
        text = _strip(open(os.path.join(CSRC, f)).read())
        funcs = out.setdefault(stem, {})
        for name, line, body in _bodies(text, INLINE if ext == ".h" else DEF):
            funcs[name] = (line, line + body.count("\n"), body)
        if ext == ".c":
            for name, line, body in _bodies(text, INLINE):
                funcs[name] = (line, line + body.count("\n"), body)
    return out


UNITS = units()
OWNER = {fn: u for u, funcs in UNITS.items() for fn in funcs}


def call_graph():
    g = {u: set() for u in UNITS}
    for u, funcs in UNITS.items():
        for _, _, body in funcs.values():
            for name in CALL.findall(body):
                v = OWNER.get(name)
                if v is not None and v != u and name not in KEYWORDS:
                    g[u].add(v)
    return g


def test_the_units_are_found():
    assert {"enter_exit", "record", "stack", "taskclock", "steps", "stage", "calibrate", "module"} <= set(UNITS)
    assert "record_call" in UNITS["record"] and "stage_exit" in UNITS["enter_exit"]
    g = call_graph()
    assert "record" in g["enter_exit"] and "record" in g["stack"], "both ends of a call go through record.c"


def test_no_call_circle_among_the_units():
    circles = cycles(call_graph())
    assert not circles, f"C units that call each other in a circle: {circles}"


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_functions_are_short(unit):
    long_ = {fn: b - a + 1 for fn, (a, b, _) in UNITS[unit].items() if b - a + 1 > MAX_LINES}
    assert not long_, f"csrc/{unit}: functions over {MAX_LINES} lines: {long_}"
