"""The breakdown table: 80 columns, tree order, sorting, CSV."""
import time

import pytest

import instrument
from instrument.exporters import table


# ------------------------------------------------------------------ report
def test_report_fits_80_columns_and_shows_tree(backend):
    with instrument.stage("request"):
        with instrument.stage("attention_mask"):
            time.sleep(0.001)
        with instrument.stage("tokenize_80"):
            pass
    text = table.render(instrument.snapshot(), width=80)
    lines = text.splitlines()
    assert all(len(l) <= 80 for l in lines)
    assert lines[0].split()[:4] == ["stage", "calls", "total", "ms"]
    assert lines[2].startswith("request ") and lines[3].startswith("  attention_mask")
    by_total = table.render(instrument.snapshot(), width=80, sort="total").splitlines()
    assert by_total[3].startswith("  attention_mask")
    csv_text = table.render(instrument.snapshot(), format="csv")
    assert csv_text.splitlines()[1].startswith("request,1,")
    with pytest.raises(ValueError, match="sort must be one of"):
        table.render(instrument.snapshot(), sort="bogus")


# ------------------------------------------------------------ what the width drops
def test_footer_names_the_columns_the_width_dropped(backend):
    instrument.configure(counters="page-faults,context-switches")
    with instrument.stage("request"):
        bytearray(1 << 20)
    snap = instrument.snapshot()
    assert snap["request"].counter("page-faults") is not None and snap["request"].verdict
    narrow = table.render(snap, width=80).splitlines()
    assert all(len(l) <= 80 for l in narrow)
    foot = " ".join(narrow[narrow.index(next(l for l in narrow if l.startswith("not shown"))):])
    assert foot.startswith("not shown at 80 columns: faults, ctxsw, verdict")
    wide = table.render(snap, width=200)
    assert "not shown" not in wide and all(h in wide.splitlines()[0] for h in ("faults", "ctxsw", "verdict"))


def test_operator_lines_show_device_time_only_where_a_device_ran():
    cpu_only = {"by_self_cpu": [{"name": "aten::addmm", "calls": 3, "self_cpu_ns": 9 * 10**6, "device_ns": 0}],
                "by_device": [], "device_total_ns": 0}
    lines = table.ops_lines(cpu_only, "  ")
    assert lines[1].split()[:2] == ["aten::addmm", "3"] and not any("device" in l for l in lines)
    gpu = dict(cpu_only, by_device=[dict(cpu_only["by_self_cpu"][0], device_ns=4 * 10**6)], device_total_ns=4 * 10**6)
    lines = table.ops_lines(gpu, "  ")
    assert lines[-1] == "  device total: 4.00 ms" and "4.00 ms device" in lines[-2]


def test_advice_names_the_snapshot_it_judges(tmp_path, capsys):
    from instrument import cli
    from snapfactory import snap, st
    snap(st("request", 10, 10**6)).save(tmp_path / "after.json")
    assert cli.main(["report", str(tmp_path / "after.json")]) == 0
    assert f"Where to look next in {tmp_path / 'after.json'} (the stages" in capsys.readouterr().out
    assert cli.main(["advise", str(tmp_path / "after.json")]) == 0
    assert capsys.readouterr().out.startswith(f"Where to look next in {tmp_path / 'after.json'}")
