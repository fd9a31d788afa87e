"""The gate suites' shared fixtures: the one download cache and the gate run in this process."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from harness.gate.cli import configure, run
from harness.support.paths import REPO_ROOT


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return Path(os.environ.get("HARNESS_GATE_CACHE") or REPO_ROOT / ".cache" / "gate")


@pytest.fixture
def gate(cache_dir, tmp_path):
    """Run the gate in this process; returns (exit code, JSON report, Markdown summary)."""

    def call(old: str, new: str, *extra: str):
        out_json, summary = tmp_path / f"{old}-{new}.json", tmp_path / f"{old}-{new}.md"
        args = configure(argparse.ArgumentParser()).parse_args(
            [
                "--from",
                old,
                "--to",
                new,
                "--cache-dir",
                str(cache_dir),
                "--json",
                str(out_json),
                "--summary",
                str(summary),
                *extra,
            ]
        )
        rc = run(args)
        return rc, json.loads(out_json.read_text()), summary.read_text()

    return call


def _covered_then_review(rc: int, rep: dict) -> bool:
    """Every finding the targeted checks name is covered (or accepted), and the gate says REVIEW (exit 3) exactly
    when code on a watched path changed that no check classifies, else 0: what a real release pair gives."""
    covered = all(f["status"] in ("covered", "accepted") for f in rep["findings"])
    expected = (3, "REVIEW") if rep["unclassified"] else (0, "NEEDS-SHIM-AND-COVERED" if rep["findings"] else "SAFE")
    return covered and (rc, rep["verdict"]) == expected


@pytest.fixture
def covered_then_review():
    return _covered_then_review
