"""Narrowing a run to rows (harness.testing.rows): what a build's report lacks, and which of the suites' real tests
observe it. The tests are collected by pytest from suites/ as they are (no vLLM is needed to collect them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness import contracts
from harness.reporting import matrix
from harness.reporting.report import read
from harness.support.paths import REPO_ROOT
from harness.testing import rows

SUITES = ["suites/contracts", "suites/e2e", "suites/native", "suites/clients", "suites/bad_input"]


def _collect(*args: str) -> list[str]:
    """The node ids pytest selects from the CPU suites with these options (collection only, in a child)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *SUITES, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


def _committed_reports():
    """The committed env reports that ran the contracts tier (the rows are the contracts')."""
    paths = sorted(p for p in (REPO_ROOT / "reports").glob("vllm*.json") if "." not in p.stem)
    return [p for p in paths if "contracts" in (read(p).get("tiers") or {})]


@pytest.mark.parametrize("path", _committed_reports(), ids=lambda p: p.stem)
def test_what_a_report_lacks_is_what_the_matrix_calls_missing(path):
    """The rows `missing` finds are exactly the rows the matrix says the report predates (one rule, two users)."""
    rep = read(path)
    wanted = rows.missing(rep, contracts.keys(), contracts.E2E_MODELS)
    expanded = set(wanted.rows) | {f"{i}[{m}]" for m in wanted.models for i in contracts.PER_MODEL}
    _, gaps = matrix._predates(rep, "pass", [])
    said = {k for g in gaps for k in g["what"].split(": ", 1)[1].split(", ")}
    assert expanded == said


def test_a_narrowed_collection_keeps_exactly_the_tests_of_the_wanted_rows():
    """A contract added (moeorder), a per-model row added (forward[tiny-llama]) and a fixture added (tiny-gemma2):
    each gets its probe, its shim proof where it has one and, for the model, its end-to-end checks; nothing else
    of the suites is kept (no soak, no bad input, no other model's rows)."""
    wanted = rows.Wanted(frozenset({"moeorder", "forward[tiny-llama]"}), frozenset({"tiny-gemma2"}))
    every = _collect()
    kept = _collect(*wanted.args())
    assert 0 < len(kept) < len(every) and set(kept) <= set(every)
    assert "suites/contracts/test_contracts.py::test_contract[moeorder]" in kept
    assert "suites/contracts/test_contracts.py::test_model_contract[forward-tiny-llama]" in kept
    if "moeorder" in contracts.proof_keys():
        assert "suites/contracts/test_shim_proofs.py::test_shim_needed_and_sufficient[moeorder]" in kept
    gemma = [n for n in every if "tiny-gemma2" in n]
    assert gemma and set(gemma) <= set(kept), "every test of the new fixture"
    for key in (f"{i}[tiny-gemma2]" for i in contracts.PER_MODEL):
        cid = key.split("[")[0]
        assert any(f"[{cid}-tiny-gemma2]" in n or f"[{key}]" in n for n in kept), key
    assert not [n for n in kept if "tiny-gemma2" not in n and "moeorder" not in n and "forward-tiny-llama" not in n]
    assert not [n for n in kept if "bad_input" in n or "test_soak" in n]


def test_a_run_narrowed_to_nothing_wanted_says_so():
    assert not rows.Wanted() and rows.Wanted().args() == []
    wanted = rows.Wanted(frozenset({"moeorder"}))
    assert json.dumps(wanted.args()) == '["--harness-only-rows=moeorder"]'
    assert wanted.describe() == "moeorder"


def test_an_e2e_row_keeps_that_model_s_end_to_end_checks_only():
    """`e2e[tiny-llama]` (what the gate asks of the runtime path) keeps the end-to-end checks on tiny-llama's shared
    generator, not its contract probes, its native rows or another model's checks."""
    kept = _collect(*rows.Wanted(frozenset({"e2e[tiny-llama]"})).args())
    assert kept and all(n.startswith("suites/e2e/") and n.endswith("[tiny-llama]") for n in kept)
    assert any("test_batch_matches_transformers" in n for n in kept)
