import csv
import io
import json

import pytest

from instrument import cli
from instrument.analysis import diff as D
from instrument.exporters import table
from snapfactory import snap, st

MS = 1_000_000


def pair(after_calls=100, after_ms=18.1):
    before = snap(st("request", 100, 25 * MS, cpu_ns=2000 * MS, counters={"instructions": {"total": 1_000_000}}),
                  st("request/tokenize", 100, 3 * MS), st("request/model", 100, 20 * MS),
                  st("request/legacy", 10, 1 * MS), st("health", 5, MS))
    after = snap(st("request", after_calls, int(after_ms * MS), cpu_ns=1500 * MS,
                    counters={"instructions": {"total": 800_000}}),
                 st("request/tokenize", after_calls, 3 * MS), st("request/model", after_calls, 14 * MS),
                 st("request/cache", 20, 2 * MS), st("health", 5, MS))
    return before, after


def test_headline_from_mean_per_call_of_the_top_stage():
    d = D.diff(*pair())
    assert table.headline(d).startswith("request: 25.0 ms → 18.1 ms (−27.6%); beyond noise: typical call −27.")
    assert d.stage == ("request",) and d.change == pytest.approx(-0.276)


def test_headline_adds_totals_when_calls_differ():
    d = D.diff(*pair(after_calls=50))
    assert table.headline(d).startswith("request: 25.0 ms → 18.1 ms (−27.6%) per call; total 2.50 s → 905 ms "
                                        "(−63.8%) over 100 → 50 calls; beyond noise")


def test_rows_union_sorted_by_absolute_change_with_one_sided_stages():
    d = D.diff(*pair())
    paths = [r.path for r in d.rows]
    assert set(paths) == {("request",), ("request", "tokenize"), ("request", "model"), ("request", "legacy"),
                          ("request", "cache"), ("health",)}
    assert paths[:2] == [("request",), ("request", "model")]          # −690 ms, −600 ms
    changes = [abs((r.metrics["total"].after or 0) - (r.metrics["total"].before or 0)) for r in d.rows]
    assert changes == sorted(changes, reverse=True)
    by = {r.path: r for r in d.rows}
    assert by[("request", "legacy")].status == "only before" and by[("request", "cache")].status == "only after"
    req = by[("request",)]
    assert req.metrics["total"].before == 2500 * MS and req.metrics["total"].after == 1810 * MS
    assert req.metrics["total"].delta == -690 * MS and req.metrics["total"].ratio == pytest.approx(0.724)
    assert req.metrics["mean"].ratio == pytest.approx(0.724)
    assert req.metrics["p50"].before == 25 * MS and req.metrics["p99"].after == 18.1 * MS
    assert req.metrics["cpu"].ratio == pytest.approx(0.75)
    assert req.counters["instructions"].ratio == pytest.approx(0.8)
    assert by[("health",)].metrics["total"].delta == 0


def test_render_formats():
    d = D.diff(*pair())
    t = table.render_diff(d)
    assert t.splitlines()[0] == table.headline(d)
    req = next(l for l in t.splitlines() if l.startswith("request "))
    assert "2500.0" in req and "1810.0" in req and "−27.6%" in req
    assert "request/legacy (only before)" in t and "request/cache (only after)" in t
    assert "~instructions: 1,000,000 → 800,000 (−20.0%, untested: one window)" in t
    rows = list(csv.DictReader(io.StringIO(table.render_diff(d, "csv"))))
    r = next(x for x in rows if x["path"] == "request/model")
    assert float(r["total_before_ns"]) == 2000 * MS and float(r["total_after_ns"]) == 1400 * MS
    j = json.loads(table.render_diff(d, "json"))
    assert j["headline"] == table.headline(d) and j["rows"][0]["total_ns"]["delta"] == -690 * MS
    assert table.render_diff(d, "markdown").startswith("**request: 25.0 ms")
    with pytest.raises(ValueError):
        table.render_diff(d, "xml")


def test_headline_when_the_top_stage_is_on_one_side():
    d = D.diff(snap(st("old", 3, 10 * MS)), snap(st("new", 1, MS)))
    assert table.headline(d) == "old: only before (30.0 ms total)" and d.change is None


def write(tmp_path, before, after):
    a, b = tmp_path / "before.json", tmp_path / "after.json"
    before.save(a)
    after.save(b)
    return a, b


@pytest.mark.parametrize("after_ms,pct,rc", [(18.1, 5, 0), (27.5, 5, 1), (27.5, 10, 0), (27.5, 9.9, 1), (25, 0, 0)])
def test_fail_if_slower(tmp_path, capsys, after_ms, pct, rc):
    a, b = write(tmp_path, *pair(after_ms=after_ms))
    assert cli.main(["diff", str(a), str(b), "--fail-if-slower", str(pct)]) == rc
    out, err = capsys.readouterr()
    assert out.startswith("request: 25.0 ms → ")
    if rc:
        assert "slower" in err and len(err.strip().splitlines()) == 1


def test_diff_cli_formats_and_without_gate(tmp_path, capsys):
    a, b = write(tmp_path, *pair(after_ms=30))
    assert cli.main(["diff", str(a), str(b)]) == 0                    # slower, but no gate asked for
    assert cli.main(["diff", str(a), str(b), "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["change"] == pytest.approx(0.2)


def test_diff_table_fits_a_width_and_names_what_it_dropped():
    d = D.diff(*pair(after_calls=50))
    full = table.render_diff(d).splitlines()
    assert max(map(len, full)) > 80
    for width in (80, 100):
        lines = table.render_diff(d, width=width).splitlines()
        assert max(map(len, lines)) <= width
        head = next(l for l in lines if l.startswith("stage "))
        assert "mean" in head and "change" in head
    footer = " ".join(table.render_diff(d, width=80).splitlines()[-2:])
    assert "not shown at 80 columns: total ms before/after/Δ" in footer
    assert "not shown at" not in table.render_diff(d, width=400)
