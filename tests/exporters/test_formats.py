"""The exporter contract: every format declares its name, file extension and
render(snaps, **options); `instrument export` builds its flags and `report --format`
its choices from the registry, so a new format is one module that shows in both
`--help`s and works; each view is rendered by the formats that list it."""
import inspect
import json
import types

import pytest

from instrument import cli, exporters
from instrument.exporters import Option
from snapfactory import snap, st


ALL = ["table", "csv", "json", "markdown", "otel", "chrome", "hatchet", "html", "prometheus"]


def test_the_formats_of_the_package_keep_the_contract():
    found = exporters.formats()
    assert sorted(found) == sorted(ALL) and next(iter(found)) == "table"   # the default leads
    for f in found.values():
        assert f.extension.startswith(".") and f.summary and f.name in f.render.__module__
        first = next(iter(inspect.signature(f.render).parameters))
        assert first == "snaps", f.name
        assert set(o.name for o in f.options) <= set(inspect.signature(f.render).parameters), f.name
        assert "more than one" in f.render.__doc__ or "Several" in f.render.__doc__ or "Each snapshot" in \
            f.render.__doc__, f"{f.name}: say what the format does with more than one snapshot"


@pytest.mark.parametrize("name", ALL)
def test_a_single_snapshot_instead_of_a_sequence_is_refused_in_one_line(name):
    with pytest.raises(TypeError, match=r"^render takes a sequence of Snapshots, such as \[snap\]$"):
        exporters.formats()[name].render(snap(st("a", 1, 1000)))


def test_formats_that_merge_count_every_call_of_every_snapshot():
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    a, b = snap(st("req", 3, 1000), pid=1), snap(st("req", 4, 1000), pid=2)
    fams = {f.name: f for f in text_string_to_metric_families(exporters.formats()["prometheus"].render([a, b]))}
    counts = [s.value for s in fams["instrument_stage_duration_seconds"].samples if s.name.endswith("_count")]
    assert counts == [7]
    tree = json.loads(exporters.formats()["hatchet"].render([a, b]))
    assert tree[0]["metrics"]["calls"] == 7


class Toy:
    """A format as a later module would add it: one stage per line, with options."""
    NAME = "stagelines"
    EXTENSION = ".txt"
    OPTIONS = (Option("sep", "what goes between the path and the calls", metavar="TEXT"),
               Option("totals", "end with the calls of every snapshot"))

    @staticmethod
    def render(snaps, sep=" ", totals=False):
        """Each stage's path and calls, one per line.

        Each snapshot in turn, its stages in tree order."""
        snaps = exporters.snapshots(snaps)
        lines = [f"{'/'.join(s.path)}{sep}{s.calls}" for x in snaps for s in x]
        return "\n".join(lines + ([f"total{sep}{sum(r.calls for x in snaps for r in x.roots)}"] if totals else []))


@pytest.fixture
def toy():
    f = exporters.register(Toy)
    yield f
    exporters.formats().pop(f.name)


def test_a_new_format_shows_in_export_help(toy, capsys):
    assert cli.main(["export", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--stagelines OUT Each stage's path and calls, one per line (OUT: a .txt file, or - for stdout)" in text
    assert "--sep TEXT with --stagelines: what goes between the path and the calls" in text
    assert "--totals with --stagelines: end with the calls of every snapshot" in text
    assert "--openmetrics with --prometheus" in text and "--title TEXT with --html" in text   # the existing ones
    with pytest.raises(ValueError, match="a format named 'stagelines' exists already"):
        exporters.register(Toy)


def test_a_new_format_works_from_the_command_line(toy, tmp_path, capsys):
    snap(st("req", 3, 1000), st("req/tok", 3, 10)).save(tmp_path / "a.json")
    snap(st("req", 5, 1000), pid=2).save(tmp_path / "b.json")
    out = tmp_path / "stages.txt"
    assert cli.main(["export", "--stagelines", str(out), str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                     "--sep", ";", "--totals"]) == 0
    assert out.read_text().splitlines() == ["req;3", "req/tok;3", "req;5", "total;8"]
    assert cli.main(["export", "--stagelines", "-", str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().out == "req 5\n"
    assert cli.main(["export", "--chrome", str(tmp_path / "t.json"), str(tmp_path / "a.json"), "--sep", ";"]) == 2
    assert capsys.readouterr().err == "instrument: export: --sep goes with --stagelines, not --chrome\n"


def test_not_a_format():
    with pytest.raises(TypeError, match="is not a format: it has no NAME, EXTENSION"):
        exporters.register(types.SimpleNamespace(render=lambda snaps: ""))


def test_a_new_format_is_a_choice_of_report_format(toy, tmp_path, capsys):
    snap(st("req", 3, 1000), st("req/tok", 3, 10)).save(tmp_path / "a.json")
    assert cli.main(["report", "--help"]) == 0
    assert "stagelines" in capsys.readouterr().out
    assert cli.main(["report", str(tmp_path / "a.json"), "--format", "stagelines"]) == 0
    assert capsys.readouterr().out == "req 3\nreq/tok 3\n"
    assert cli.main(["report", str(tmp_path / "a.json"), "--format", "stagelines", "--depth", "1"]) == 2
    assert capsys.readouterr().err == ("instrument: report: --depth goes with --format table, csv, json or markdown, "
                                       "not stagelines\n")


def test_report_and_export_write_the_same_breakdown(tmp_path, capsys):
    import csv
    snap(st("req", 3, 1000), st("req/tok", 3, 10), st("req/tok/x", 3, 5), st("req/big", 3, 900)).save(tmp_path / "a.json")
    for fmt in ("table", "csv", "json", "markdown", "hatchet"):
        assert cli.main(["report", str(tmp_path / "a.json"), "--format", fmt] +
                        (["--sort", "total", "--depth", "2"] if fmt != "hatchet" else [])) == 0
        reported = capsys.readouterr().out
        if fmt == "table":
            reported = reported[:reported.index("\n\nWhere to look next")] + "\n"   # report adds the advice
        assert cli.main(["export", f"--{fmt}", "-", str(tmp_path / "a.json")] +
                        (["--sort", "total", "--depth", "2"] if fmt != "hatchet" else [])) == 0
        assert capsys.readouterr().out.rstrip("\n") == reported.rstrip("\n"), fmt   # print adds a line to CSV
    rows = list(csv.DictReader(reported_csv(tmp_path, capsys).splitlines()))
    assert [r["path"] for r in rows] == ["req", "req/big", "req/tok"]        # by total, two deep
    assert cli.main(["export", "--csv", "-", str(tmp_path / "a.json"), "--depth", "0"]) == 2
    assert "argument --depth: must be a positive integer, got '0'" in capsys.readouterr().err


def reported_csv(tmp_path, capsys):
    assert cli.main(["export", "--csv", "-", str(tmp_path / "a.json"), "--sort", "total", "--depth", "2"]) == 0
    return capsys.readouterr().out


def test_each_view_in_the_formats_that_render_it():
    assert exporters.DIFF.formats() == ("table", "csv", "json", "markdown")
    assert exporters.TAIL.formats() == ("table", "json", "markdown")
    assert exporters.RANKS.formats() == ("table", "json")
    assert exporters.ADVICE.formats() == ("table", "json")
    assert exporters.OPERATORS.formats() == ("table", "json", "markdown")
    with pytest.raises(ValueError, match=r"^format must be one of table, json, got 'csv'$"):
        exporters.ADVICE.render([], "csv")
    assert json.loads(exporters.ADVICE.render([], "json")) == []


def test_a_format_that_names_an_unknown_view_is_refused():
    bad = types.SimpleNamespace(NAME="bad", EXTENSION=".txt", render=lambda snaps: "", VIEWS={"flame": str})
    with pytest.raises(TypeError, match="'bad' renders unknown views flame; the views are: diff, tail, advice"):
        exporters.register(bad)
