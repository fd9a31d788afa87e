"""The paired benchmark's arithmetic: interleaving, alternating order, ratio per pair, verdict, matrix cell."""

import time

import pytest

from harness.reporting.matrix import bench_cell
from harness.scenarios import bench


def test_pairs_interleave_and_alternate_after_warmup():
    calls = []
    result = bench.paired(lambda: calls.append("p"), lambda: calls.append("e"), pairs=4, warmup=1)
    assert calls == ["p", "e", "p", "e", "e", "p", "p", "e", "e", "p"]
    assert result["pairs"] == 4 and len(result["ratio"]["all"]) == 4


def test_ratio_is_plain_time_over_extraction_time_per_pair():
    result = bench.paired(lambda: time.sleep(0.05), lambda: time.sleep(0.25), pairs=3, warmup=0)
    r = result["ratio"]
    # extraction five times as slow: about 0.2 (bounds wide enough for a loaded machine's oversleeping)
    assert 0.02 < r["min"] <= r["median"] <= r["max"] < 0.8
    assert r["all"] == [p / e for p, e in zip(result["plain_s"]["all"], result["extract_s"]["all"], strict=True)]
    assert "below the goal of 0.9x" in bench.verdict(r)


def test_verdict_meets_goal_at_or_above_it():
    assert "meets the goal" in bench.verdict({"median": 0.9, "min": 0.8, "max": 1.0, "all": [0.8, 0.9, 1.0]})


def test_zero_pairs_refused():
    with pytest.raises(ValueError):
        bench.paired(lambda: None, lambda: None, pairs=0)


def test_matrix_cell_shows_spread_or_marks_a_single_measurement():
    assert bench_cell({"ratio": {"median": 0.93, "min": 0.81, "max": 1.02, "all": []}}) == "0.93 (0.81–1.02)"
    assert bench_cell({"ratio": 1.3}) == "1.30 (single, unpaired)"
    assert bench_cell(None) == "—"
