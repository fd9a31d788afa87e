"""The consecutive-release table's decided column agrees with the matrix: each pair the sweep decided by a targeted
run of the candidate gets the same verdict when the same rows are read from the matrix's complete runs of the same
builds (reports/<env>.json). A disagreement is a defect of one of the two: the targeted run, or the full one."""

from __future__ import annotations

import json

import pytest

from harness.gate.decide.observed import judge
from harness.gate.observe import committed_report
from harness.support.paths import REPO_ROOT

PAIRS = json.loads((REPO_ROOT / "reports" / "gate-release-pairs.json").read_text())["pairs"]
DECIDED = [p for p in PAIRS if p.get("dynamic")]


def test_the_decided_column_never_says_review():
    assert not [p for p in DECIDED if p["dynamic"]["verdict"] == "REVIEW"]


@pytest.mark.parametrize("pair", DECIDED, ids=lambda p: f"{p['from']}->{p['to']}")
def test_a_decided_pair_agrees_with_the_matrix_s_runs_of_the_same_builds(pair):
    d = pair["dynamic"]
    assert d["rows"] and d["observed_verdict"] in ("SAFE", "NEEDS-SHIM-AND-COVERED", "NEEDS-NEW-SHIM", "BROKEN"), d
    candidate, where = committed_report(pair["to"])
    assert candidate is not None, f"the matrix has no complete run of {pair['to']}: {where}"
    baseline, _ = committed_report(pair["from"])
    matrix = judge(d["rows"], candidate, baseline, where)
    disagree = {
        j.row: (j.outcome, d["observed"].get(j.row)) for j in matrix.rows if j.outcome != d["observed"].get(j.row)
    }
    assert matrix.verdict == d["observed_verdict"], f"rows observed differently (matrix, targeted): {disagree}"
