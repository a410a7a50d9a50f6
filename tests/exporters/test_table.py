"""The breakdown table: 80 columns, tree order, sorting, CSV."""
import time

import pytest

import instrument
from instrument.exporters import TAIL, table
from instrument.exporters import csv as as_csv, json as as_json, markdown as as_markdown
from instrument.exporters.format import ops_lines


# ------------------------------------------------------------------ report
def test_an_estimate_wider_than_its_value_reads_unknown():
    from instrument.analysis.metrics import Bar
    from instrument.exporters.format import metric_text
    assert metric_text("ms", Bar(22.59e6, 247.9e6)) == "?"      # not ~22.59±247.9: no figure worth reading
    assert metric_text("ms", Bar(22.59e6, 1.2e6)) == "22.59±1.20"
    assert metric_text("ms", Bar(1e6, 1e6)) == "1.00±1.00"


def test_report_fits_80_columns_and_shows_tree(backend):
    with instrument.stage("request"):
        with instrument.stage("attention_mask"):
            time.sleep(0.001)
        with instrument.stage("tokenize_80"):
            pass
    text = table.render([instrument.snapshot()], width=80)
    lines = text.splitlines()
    assert all(len(l) <= 80 for l in lines)
    assert lines[0].split()[:4] == ["stage", "calls", "total", "ms"] and "p50" in lines[0].split()
    assert lines[2].startswith("request ") and lines[3].startswith("  attention_mask")
    by_total = table.render([instrument.snapshot()], width=80, sort="total").splitlines()
    assert by_total[3].startswith("  attention_mask")
    csv_text = as_csv.render([instrument.snapshot()])
    assert csv_text.splitlines()[1].startswith("request,request,1,")
    with pytest.raises(ValueError, match="sort must be one of"):
        table.render([instrument.snapshot()], sort="bogus")


def test_errors_get_a_column_wherever_calls_are_shown_when_any(backend):
    import csv
    import json
    failed = 0
    for k in range(12):
        try:
            with instrument.stage("request"):
                with instrument.stage("io"):
                    if k % 4 == 0:
                        raise ConnectionError("reset")
        except ConnectionError:
            failed += 1
    snap = instrument.snapshot()
    lines = table.render([snap], width=80).splitlines()
    head = lines[0].split()
    assert head[:3] == ["stage", "calls", "errors"] and all(len(line) <= 80 for line in lines)
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    assert rows["request"][1:3] == ["12", str(failed)] and rows["io"][1:3] == ["12", str(failed)]
    by_path = {r["path"]: r for r in csv.DictReader(as_csv.render([snap]).splitlines())}
    assert by_path["request/io"]["errors"] == str(failed) == "3"
    assert {tuple(r["path"]): r["errors"] for r in json.loads(as_json.render([snap]))} == \
        {("request",): 3, ("request", "io"): 3}
    assert as_markdown.render([snap]).splitlines()[0].startswith("| stage | calls | errors |")
    instrument.reset()
    with instrument.stage("request"):
        pass
    clean = instrument.snapshot()
    assert "errors" not in table.render([clean], width=80).splitlines()[0].split()
    assert "errors" not in as_csv.render([clean]).splitlines()[0].split(",")


# ------------------------------------------------------------ what the width drops
def test_footer_names_the_columns_the_width_dropped(backend):
    instrument.configure(counters="page-faults,context-switches")
    with instrument.stage("request"):
        bytearray(1 << 20)
    snap = instrument.snapshot()
    assert snap["request"].counter("page-faults") is not None and snap["request"].verdict
    narrow = table.render([snap], width=80).splitlines()
    assert all(len(l) <= 80 for l in narrow)
    foot = " ".join(narrow[narrow.index(next(l for l in narrow if l.startswith("not shown"))):])
    assert foot.startswith("not shown at 80 columns: ")
    dropped = foot[len("not shown at 80 columns: "):foot.index(" (a wider")].split(", ")
    assert {"faults", "ctxsw"} <= set(dropped) and narrow[0].split()[-1] == "verdict"   # the verdict stays at 80
    assert not set(dropped) & set(narrow[0].split())          # a column is shown or named, never both
    wide = table.render([snap], width=240)
    assert "not shown" not in wide and all(h in wide.splitlines()[0] for h in dropped)


def test_operator_lines_show_device_time_only_where_a_device_ran():
    cpu_only = {"by_self_cpu": [{"name": "aten::addmm", "calls": 3, "self_cpu_ns": 9 * 10**6, "device_ns": 0}],
                "by_device": [], "device_total_ns": 0}
    lines = ops_lines(cpu_only, "  ")
    assert lines[1].split()[:2] == ["aten::addmm", "3"] and not any("device" in l for l in lines)
    gpu = dict(cpu_only, by_device=[dict(cpu_only["by_self_cpu"][0], device_ns=4 * 10**6)], device_total_ns=4 * 10**6)
    lines = ops_lines(gpu, "  ")
    assert lines[-1] == "  device total: 4.00 ms" and "4.00 ms device" in lines[-2]


def test_advice_names_the_snapshot_it_judges(tmp_path, capsys):
    from instrument import cli
    from snapfactory import snap, st
    snap(st("request", 10, 10**6)).save(tmp_path / "after.json")
    assert cli.main(["report", str(tmp_path / "after.json")]) == 0
    assert f"Where to look next in {tmp_path / 'after.json'} (the stages" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["advise", str(tmp_path / "after.json")]) == 0
    assert " ".join(capsys.readouterr().out.split()).startswith(f"Where to look next in {tmp_path / 'after.json'}")


# ------------------------------------------------------------- items and tail
def _tail_snapshot():
    from instrument.snapshot import Snapshot
    from snapfactory import snap, st
    ms = 1_000_000

    def call(seq, pre, fwd, slow, sample):
        return {"path": ["request"], "wall_ns": pre + fwd, "start_ns": seq, "pid": 1, "tid": 1, "seq": seq,
                "slow": slow, "sample": sample, "breakdown": [{"path": ["request", "pre"], "wall_ns": pre},
                                                               {"path": ["request", "forward"], "wall_ns": fwd}]}
    walls = [2 * ms] * 99 + [12 * ms]
    s = snap(st("request", 0, 0, values=walls), st("request/pre", 100, 0.2 * ms),
             st("request/forward", 100, 1.8 * ms))
    fwd = s["request/forward"]
    stages = [x if x.path != fwd.path else
              type(fwd)(**{**fwd.__dict__, "items": {"tokens": {"total": 36_000, "calls": 100}}}) for x in s]
    ex = [call(k, ms // 5, 9 * ms // 5, False, True) for k in range(8)] + [call(99, 10 * ms, 2 * ms, True, False)]
    return Snapshot(stages, s.meta, None, ex)


def test_tail_column_and_item_lines():
    s = _tail_snapshot()
    text = table.render([s], width=80)
    lines = text.splitlines()
    assert all(len(l) <= 80 for l in lines)
    head = lines[0].split()
    assert head[head.index("%root") + 1] == "tail%" and "C/W" not in head   # C/W gives way at 80 columns
    pre = next(l for l in lines if l.strip().startswith("pre "))
    assert pre.split()[head.index("tail%") - 1] == "98.0"   # 9.8 of the 10 ms more that the slow call took
    fwd_at = next(i for i, l in enumerate(lines) if l.strip().startswith("forward "))
    # 36,000 tokens in 180 ms: 5.00 µs per token, 200k tokens per second
    assert lines[fwd_at + 1].strip() == "tokens: 36,000 in 100 adds · 5.00 µs/token · 200k tokens/s"
    assert "tail%" in table.render([s], width=120).splitlines()[0] and "C/W" in table.render([s], width=120)
    rows = list(__import__("csv").reader(as_csv.render([s]).splitlines()))
    assert rows[0][-3:] == ["tokens", "ns/tokens", "tokens/s"]
    fwd = next(r for r in rows if r[0] == "request/forward")
    assert float(fwd[-2]) == 5000.0 and float(fwd[-1]) == 200_000.0
    js = {tuple(r["path"]): r for r in __import__("json").loads(as_json.render([s]))}
    assert js[("request", "forward")]["items"]["tokens"]["ns_per_item"] == 5000.0
    assert js[("request", "pre")]["tail_pct"] == pytest.approx(98.0)   # percent, as root_pct
    md = as_markdown.render([s])
    assert "| tail% |" in md.splitlines()[0] and "5.00 µs/token" in md


def test_render_tail_text_and_json():
    from instrument.analysis.tail import tail
    s = _tail_snapshot()
    text = TAIL.render(tail(s))
    lines = text.splitlines()
    assert lines[0].startswith("Tail of request: 100 calls") and "10.0 ms more" in lines[0]
    assert lines[1].startswith("Slow calls of request (≥ p99) are 10 ms slower than a typical one; 98% of that is "
                               "request/pre"), lines[1]
    assert lines[3].split() == ["stage", "slow", "ms", "typical", "ms", "excess", "ms", "share%", "grew", "most"]
    row = lines[5].split()
    assert row[0] == "request/pre" and row[4] == "98.0" and row[5] == "unknown", row   # no split kept: unknown
    obj = __import__("json").loads(TAIL.render(tail(s), "json"))
    assert obj["stage"] == ["request"] and obj["excess"][0]["path"] == ["request", "pre"]
    two = __import__("json").loads(TAIL.render(tail(s) * 2, "json"))
    assert isinstance(two, list) and len(two) == 2
    assert "No exemplars" in TAIL.render([])
    with pytest.raises(ValueError, match="format must be one of"):
        TAIL.render(tail(s), "csv")
