"""The advice: a next step for every verdict the judge can give."""
import os
import re

from instrument.analysis import advice, verdict


def test_every_verdict_has_a_next_step():
    source = open(os.path.abspath(verdict.__file__), encoding="utf-8").read()
    given = set(re.findall(r'out\("([a-z?-]+)"', source))
    assert {"waiting", "cpu-starved", "loop-blocked", "compute-bound", "unknown"} <= given   # the reading works
    assert given <= set(advice.NEXT_STEP), sorted(given - set(advice.NEXT_STEP))
