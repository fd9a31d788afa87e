"""The gate suites' shared fixtures: the one download cache and the gate run in this process."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from harness.gate.cli import configure, run
from harness.paths import REPO_ROOT


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return Path(os.environ.get("HARNESS_GATE_CACHE") or REPO_ROOT / ".cache" / "gate")


@pytest.fixture
def gate(cache_dir, tmp_path):
    """Run the gate in this process; returns (exit code, JSON report, Markdown summary)."""

    def call(old: str, new: str, *extra: str):
        out_json, summary = tmp_path / f"{old}-{new}.json", tmp_path / f"{old}-{new}.md"
        args = configure(argparse.ArgumentParser()).parse_args(
            ["--from", old, "--to", new, "--cache-dir", str(cache_dir), "--json", str(out_json),
             "--summary", str(summary), *extra])
        rc = run(args)
        return rc, json.loads(out_json.read_text()), summary.read_text()

    return call
