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
