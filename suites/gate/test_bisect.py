"""`gate bisect` names the first release in which a contract changed, on real released sources (cached after the
first read), and agrees with what the CPU matrix observed (twophase shimmed from 0.11.1, request from 0.12.0 for
the block hasher, and eos_token_id gone in 0.17.0)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.support.paths import REPO_ROOT


def bisect(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "gate", "bisect", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )


@pytest.mark.parametrize(
    "argv,first,before,evidence",
    [
        (["--contract", "twophase", "--between", "0.11.0", "0.17.0"], "0.11.1", "0.11.0", "two-phase-execute"),
        (
            ["--contract", "request", "--match", "eos_token_id", "--between", "0.11.0", "0.20.0"],
            "0.17.0",
            "0.16.0",
            "keyword-removed: vllm.v1.request:Request(eos_token_id=)",
        ),
        (["--contract", "request", "--between", "0.11.0", "0.12.0"], "0.12.0", "0.11.2", "block-hashes-required"),
    ],
    ids=["twophase", "request-eos_token_id", "request-block_hasher"],
)
def test_bisect_names_the_first_release_and_its_evidence(argv, first, before, evidence):
    out = bisect(*argv)
    assert out.returncode == 0, out.stderr[-800:]
    assert f"{argv[1]}: first changed in {first} (no finding in {before};" in out.stdout, out.stdout
    assert evidence in out.stdout, out.stdout


def test_bisect_says_when_nothing_changed_and_refuses_an_unknown_contract():
    out = bisect("--contract", "twophase", "--between", "0.11.1", "0.12.0")
    assert out.returncode == 1 and "twophase: no finding between 0.11.1 and 0.12.0" in out.stdout, out.stderr[-500:]
    out = bisect("--contract", "nosuch")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "unknown contract 'nosuch'" in out.stderr
