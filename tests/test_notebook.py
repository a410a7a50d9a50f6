"""The breakdown in a notebook: a real notebook executed in a real IPython kernel (nbclient, ipykernel), its
cell outputs read back and the reports they hold rendered in Chromium."""
import html as htmllib
import json
import re
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from browser import chromium, measure  # noqa: E402,F401
from instrument.snapshot import Snapshot, path_text  # noqa: E402

LOOP = ("for k in range(30):\n    with instrument.stage('request'):\n        with instrument.stage('io'):\n"
        "            time.sleep({sleep})\n        with instrument.stage('spin'):\n            sum(range(30_000))")
FAILS = "raises-exception"   # nbclient's tag for a cell expected to fail


def cells(tmp_path):
    """The notebook: (source, tags) per cell."""
    before, after, everything, many = (str(tmp_path / f) for f in ("before.json", "after.json", "all.json",
                                                                    "many.json"))
    return [("import time\nimport instrument\n%load_ext instrument", []),
            ("%%instrument before --stage slow\n" + LOOP.format(sleep=0.004), []),
            (f"before.save({before!r})", []),                                # kept under its name
            ("%%instrument --stage fast\n" + LOOP.format(sleep=0.001), []),
            (f"after = _\nafter.save({after!r})\ninstrument.snapshot().save({everything!r})", []),
            ("%instrument_report", []),
            ("%instrument_report before", []),
            (f"%instrument_diff before {after}", []),
            ("instrument.snapshot()", []),
            ("%%instrument --stage failing\nraise ValueError('a cell that fails')", [FAILS]),
            ("%instrument_diff before", [FAILS]),
            ("%%instrument one\nsum(range(100_000))", []),                   # 12: one call a side
            ("%%instrument two\nsum(range(100_000))", []),
            ("%instrument_diff one two", []),
            ("%%instrument many -n 6\nran = globals().get('ran', 0) + 1\nsum(range(100_000))", []),   # 15: six calls
            (f"many.save({many!r})\nran", []),
            ("%%instrument more -n 6\nsum(range(100_000))", []),
            ("%instrument_diff many more", []),
            ("%%instrument -n 0\npass", [FAILS]),
            ("model = 'kept'", []),                                            # 20
            ("%%instrument model\npass", [FAILS]),                            # 21: would replace a user's variable
            ("model", [])]


def run_notebook(tmp_path, monkeypatch, sources):
    """Execute the cells in a fresh kernel of this interpreter; the executed notebook."""
    spec = tmp_path / "jupyter" / "kernels" / "instrument-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "instrument test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src, metadata={"tags": tags})
                                         for src, tags in sources])
    nbclient.NotebookClient(nb, kernel_name="instrument-test", timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


def report_of(output):
    """The report page an output holds: the srcdoc of its one iframe, and the data the page renders."""
    shown = output["data"]["text/html"]
    frames = re.findall(r'<iframe [^>]*srcdoc="([^"]*)"', shown)
    assert len(frames) == 1 and 'sandbox="allow-scripts"' in shown, shown[:300]
    page = htmllib.unescape(frames[0])
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    return shown, page, data


def outputs(cell, kind):
    return [o for o in cell.outputs if o["output_type"] == kind]


TABLE = """
var rows = {};
document.querySelectorAll("#table tbody tr").forEach(function (tr) {
  var v = tr.querySelector("td.verdict"), r = tr.getBoundingClientRect(), vr = v.getBoundingClientRect();
  rows[tr.children[0].title] = {verdict: v.textContent, right: vr.right, bar: !!tr.querySelector(".split")}; });
return {rows: rows, width: window.innerWidth, headline: (document.getElementById("headline") || {}).textContent || null};
"""


def test_magics_and_inline_reports_in_a_real_kernel(tmp_path, monkeypatch, chromium):
    c = [None] + run_notebook(tmp_path, monkeypatch, cells(tmp_path)).cells   # c[k]: the k-th cell
    before, after = Snapshot.load(tmp_path / "before.json"), Snapshot.load(tmp_path / "after.json")
    everything = Snapshot.load(tmp_path / "all.json")

    # %%instrument: the cell as a stage, and exactly what it recorded (30 requests), shown and returned
    assert before["slow"].calls == 1 and before["slow/request"].calls == 30 and before["slow/request/io"].calls == 30
    assert after["fast/request"].calls == 30 and after.get("slow") is None      # the second cell's window only
    assert everything["slow/request"].calls == everything["fast/request"].calls == 30
    assert after["fast"].wall_total >= 30 * 1_000_000 and before["slow"].wall_total >= 30 * 4_000_000
    for cell, snap in ((c[2], before), (c[4], after)):
        shown, page, data = report_of(outputs(cell, "execute_result")[0])
        stages = {tuple(s["path"]): s for s in data["after"]["stages"]}
        assert set(stages) == {s.path for s in snap}
        assert {p: s["verdict"] for p, s in stages.items()} == {s.path: s.verdict["verdict"] for s in snap}
        assert "http://" not in shown and "https://" not in shown and "<link" not in page and " src=" not in page
        got = measure(chromium, page, tmp_path, TABLE, size=(1000, 800))   # the page as the frame shows it
        assert {k: v["verdict"] for k, v in got["rows"].items()} == \
            {path_text(s.path): s.verdict["verdict"] for s in snap}
        assert all(v["right"] <= got["width"] for v in got["rows"].values())   # verdicts in view at 1,000 px
        assert got["rows"][path_text(snap.roots[0].path + ("request", "io"))]["bar"]

    # %instrument_report: everything so far, or the snapshot named
    _, _, data = report_of(outputs(c[6], "execute_result")[0])
    assert {tuple(s["path"]) for s in data["after"]["stages"]} >= {s.path for s in everything}
    _, _, data = report_of(outputs(c[7], "execute_result")[0])
    assert {tuple(s["path"]): s["calls"] for s in data["after"]["stages"]} == {s.path: s.calls for s in before}

    # %instrument_diff: a variable against a file, tested against noise; its text form is the headline
    result = outputs(c[8], "execute_result")[0]
    _, page, data = report_of(result)
    assert data["before"]["label"] == "before" and data["diff"]["headline"] == result["data"]["text/plain"]

    # a Snapshot shows as the report by itself (its _repr_html_), without any magic
    _, _, data = report_of(outputs(c[9], "execute_result")[0])
    assert {("slow", "request", "io"), ("fast", "request", "spin")} <= {tuple(s["path"]) for s in data["after"]["stages"]}

    # a failing cell: its traceback shown once, the stage counts the error, the notebook goes on
    errors = outputs(c[10], "error")
    assert len(errors) == 1 and errors[0]["ename"] == "ValueError"
    _, _, data = report_of(outputs(c[10], "execute_result")[0])
    failing = next(s for s in data["after"]["stages"] if s["path"] == ["failing"])
    assert failing["calls"] == 1 and failing["errors"] == 1

    # a bad argument: one line naming what was wrong and what is allowed
    said = "".join(o["text"] for o in outputs(c[11], "stream")).strip()   # IPython prints a UsageError, no trace
    assert said.startswith("UsageError: %instrument_diff compares two snapshots, BEFORE AFTER") and "got 1" in said
    assert len(said.splitlines()) == 1

    # one call a side: no spread, so no judgement; it says so and how many calls would measure one
    said = outputs(c[14], "execute_result")[0]["data"]["text/plain"]
    assert "cell: 1 call a side measure no spread, so no change can be judged; run each cell 5 times or more " \
           "(%%instrument -n 5)" in said and "cell: 1 call a side" in outputs(c[14], "execute_result")[0]["data"][
               "text/html"].split("<iframe")[0]
    # -n 6: the cell ran six times, each a call of stage `cell`, its output shown once; the snapshot kept by name
    assert Snapshot.load(tmp_path / "many.json")["cell"].calls == 6
    assert outputs(c[16], "execute_result")[0]["data"]["text/plain"] == "6"
    assert len(outputs(c[15], "execute_result")) == 2   # the first run's value, then the snapshot
    said = outputs(c[18], "execute_result")[0]["data"]["text/plain"]
    assert "measure no spread" not in said and said.startswith("cell: ")
    assert "UsageError: %%instrument: -n (how many times to run the cell) must be 1 or more, got 0" in \
        "".join(o["text"] for o in outputs(c[19], "stream") + outputs(c[19], "error")) + \
        " ".join(str(o.get("evalue")) for o in outputs(c[19], "error"))
    # NAME never replaces a variable of the user's that is not a snapshot: it says so, and names --stage
    said = "".join(o["text"] for o in outputs(c[21], "stream")) + " ".join(str(o.get("evalue")) for o in
                                                                         outputs(c[21], "error"))
    assert "model already holds a str" in said and "--stage model" in said, said
    assert outputs(c[22], "execute_result")[0]["data"]["text/plain"] == "'kept'"


def test_a_snapshot_shows_inline_as_one_sandboxed_frame_whatever_its_names():
    """Outside any kernel too: one iframe, its document in an attribute that no stage name can end, nothing to
    fetch."""
    from html.parser import HTMLParser
    import instrument
    evil = '"><script>document.title="INJECTED"</script>'
    instrument.reset()
    with instrument.stage(evil):
        pass
    shown = instrument.snapshot()._repr_html_()

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags = []

        def handle_starttag(self, tag, attrs):
            self.tags.append((tag, dict(attrs)))
    parsed = Tags()
    parsed.feed(shown)
    assert [t for t, _ in parsed.tags] == ["iframe"]
    attrs = parsed.tags[0][1]
    assert attrs["sandbox"] == "allow-scripts" and attrs["srcdoc"].startswith("<!DOCTYPE html>")
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', attrs["srcdoc"],
                                re.S).group(1))
    assert [s["path"] for s in data["after"]["stages"]] == [[evil]]
    assert "http://" not in shown and "https://" not in shown
    instrument.reset()
