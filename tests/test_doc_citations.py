"""Every test the docs cite as proof exists: `tests/<path>.py` is a file, and `::name` (or a `::name` that goes on
from the file cited before it on the line) is a test defined in it."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CITE = re.compile(r"`((?:[\w./-]*test_\w+\.py)?(?:::\w+)?)`")


def citations():
    """(doc:line, file cited, test name or None) of every cited test in docs/*.md and README.md."""
    for doc in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        with open(doc, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                last = None
                for m in CITE.finditer(line):
                    path, _, name = m.group(1).partition("::")
                    if not path and not name:
                        continue
                    last = path or last
                    yield f"{os.path.relpath(doc, ROOT)}:{n}", last, name or None


def test_every_cited_test_exists():
    found = list(citations())
    assert len(found) >= 40          # docs/reliability.md alone cites that many
    wrong = []
    for where, path, name in found:
        full = os.path.join(ROOT, path or "")
        if not path or not path.startswith("tests/") or not os.path.isfile(full):
            wrong.append(f"{where}: {path!r} is not a file under tests/")
            continue
        if name:
            with open(full, encoding="utf-8") as f:
                if not re.search(rf"^(?:async )?def {name}\(", f.read(), re.M):
                    wrong.append(f"{where}: {path} defines no {name}")
    assert not wrong, "\n".join(wrong)
