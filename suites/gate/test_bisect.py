"""`gate bisect` names the first release in which a contract changed, on real released sources (cached after the
first read), and agrees with what the CPU matrix observed (sched shimmed from 0.11.1, request from 0.12.0)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.paths import REPO_ROOT


def bisect(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "gate", "bisect", *argv], capture_output=True, text=True,
                          timeout=600, cwd=REPO_ROOT)


@pytest.mark.parametrize("contract,first,before,evidence", [
    ("sched", "0.11.1", "0.11.0", "vllm/v1/core/sched/scheduler.py:"),
    ("request", "0.12.0", "0.11.2", "vllm/v1/request.py:"),
])
def test_bisect_names_the_first_release_and_its_evidence(contract, first, before, evidence):
    out = bisect("--contract", contract, "--between", "0.11.0", "0.12.0")
    assert out.returncode == 0, out.stderr[-800:]
    assert f"{contract}: first changed in {first} (no finding in {before};" in out.stdout
    assert evidence in out.stdout


def test_bisect_says_when_nothing_changed_and_refuses_an_unknown_contract():
    out = bisect("--contract", "twophase", "--between", "0.11.1", "0.12.0")
    assert out.returncode == 1 and "twophase: no finding between 0.11.1 and 0.12.0" in out.stdout, out.stderr[-500:]
    out = bisect("--contract", "nosuch")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "unknown contract 'nosuch'" in out.stderr
