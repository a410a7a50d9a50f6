"""The ranks of a job in the exports: the `rank` label of the Prometheus exposition (read back by
prometheus_client's parser and linted by promtool) and the heat map of the HTML report (rendered by
headless Chromium)."""
import html as htmllib
import re

import pytest

from instrument.exporters import html
from instrument.snapshot import Snapshot, merge_all
from snapfactory import snap, st
from browser import browse, chromium  # noqa: F401  (the fixture)
from test_html import EVIL

MS = 1_000_000


def rank_snap(rank, *stages, world=4):
    s = snap(*stages, pid=1000 + rank)
    return Snapshot(s.stages, dict(s.meta, distributed={"rank": rank, "world_size": world}))


def job(world=4, present=(0, 1, 2, 3)):
    return merge_all([rank_snap(r, st("step", 10, 25 * MS), st("step/preprocess", 10, (21 if r == 2 else 1) * MS),
                                      st(("step", EVIL[0]), 10, MS), st("step/dist.all_reduce", 10, (1 if r == 2 else 21) * MS),
                                      world=world) for r in present])


def test_prometheus_rank_label():
    prometheus = pytest.importorskip("instrument.exporters.prometheus")
    from prometheus_client.parser import text_string_to_metric_families
    from test_prometheus import PROMTOOL, promtool_check

    def ranked(s, family):
        fams = {f.name: f for f in text_string_to_metric_families(prometheus.render([s]))}
        return {(x.labels["path"], x.labels["rank"]): x.value for x in fams[family].samples}

    merged = job()
    seconds = ranked(merged, "instrument_stage_rank_seconds")
    assert seconds[("step/preprocess", "2")] == pytest.approx(0.21) and seconds[("step/preprocess", "0")] == 0.01
    assert len(seconds) == 4 * 4
    assert ranked(merged, "instrument_stage_rank_calls")[("step/dist.all_reduce", "3")] == 10
    own = rank_snap(2, st("step", 7, MS), st("step/x", 7, MS // 2, self_ns=3 * MS))      # a rank serving itself
    assert ranked(own, "instrument_stage_rank_self_seconds") == {("step", "2"): 0.007, ("step/x", "2"): 0.003}
    assert ranked(snap(st("step", 3, MS)), "instrument_stage_rank_seconds") == {}          # no rank, no series
    if PROMTOOL:
        assert promtool_check(prometheus.render([merged])) == (0, "")


def test_html_heat_map_of_stage_by_rank(chromium, tmp_path):  # noqa: F811
    page = tmp_path / "ranks.html"
    page.write_text(html.render([job(world=5)]))
    dom = browse(chromium, page, tmp_path, "dom")
    assert 'data-rendered="1"' in dom and 'id="ranks-card" hidden' not in dom
    assert re.search(r"<title>([^<]*)</title>", dom).group(1) == "instrument: stage breakdown"   # nothing injected ran
    card = dom.split('id="ranks-card"', 1)[1].split("</section>", 1)[0]
    text = htmllib.unescape(re.sub(r"<[^>]+>", " ", card))
    assert "Straggler: rank 2 in step/preprocess, +20.00 ms per step" in " ".join(text.split())
    assert "Missing: rank 4: no snapshot" in text and "rank 4 (missing)" in text
    rows = re.findall(r"<tr>(.*?)</tr>", card.split('id="ranks"', 1)[1], re.S)
    cells = [[htmllib.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r)]
             for r in rows]
    assert cells[0] == ["stage", "rank 0", "rank 1", "rank 2", "rank 3", "rank 4 (missing)"]
    pre = next(c for c in cells if c[0].endswith("preprocess"))
    assert pre[1:] == ["1.00", "1.00", "21.00", "1.00", "\u2014"]
    assert any(c[0].endswith(EVIL[0]) for c in cells)       # a hostile name, shown as text, as written
    slowest = re.findall(r'<td class="heat slowest"[^>]*>([^<]*)</td>', card)
    assert "21.00" in slowest
