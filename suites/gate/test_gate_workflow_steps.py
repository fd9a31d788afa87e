"""The reusable workflow's and the composite action's gate step, run exactly as GitHub runs them.

Read from the YAML, not restated: the step's `run:` line and its `env:` block, with `${{ inputs.* }}` taken from
the call's inputs (the workflow's declared defaults otherwise) and `${{ runner.temp }}` the runner's temp folder.
The step runs in a downstream checkout (a lock file pinning vLLM, this harness checked out where the workflow
puts it) with the environment GitHub gives: relative paths included (the workflow's `HARNESS_GATE_CACHE` is
`.cache/gate`, the path its cache step restores into the workspace). An expression this test does not know fails
it: the YAML and this test cannot drift apart silently.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.support.paths import REPO_ROOT

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "gate-call.yml"
ACTION = REPO_ROOT / ".github" / "actions" / "gate" / "action.yml"
OLD, NEW = "0.32.0", "0.34.0"
#: The downstream lock's speculators pin: the in-process release whose path is judged.
SPECULATORS_PIN = '[[package]]\nname = "speculators"\nversion = "0.3.0"\n'
EXPR = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def evaluate(text: str, inputs: dict, runner_temp: Path) -> str:
    """`text` with the GitHub expressions the gate steps use replaced; any other expression fails the test."""

    def one(m: re.Match) -> str:
        expr = m.group(1)
        if expr.startswith("inputs."):
            return str(inputs[expr[len("inputs.") :]])
        if expr == "runner.temp":
            return str(runner_temp)
        if expr == "steps.python.outputs.python-path":  # what the action's setup-python step hands over
            return shutil.which("python3") or sys.executable
        pytest.fail(f"the gate step uses an expression this test does not evaluate: {expr!r}")

    return EXPR.sub(one, text)


def link_or_copy(src: str, dst: str) -> None:
    """Hard links where the two folders share a file system (cheap), a copy elsewhere."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def restore_cache(cache_dir: Path, dest: Path) -> None:
    """What the workflow's cache step restores: both versions' sources (fetched into the suite's cache first)."""
    from harness.envs import sources

    for version in (OLD, NEW):
        src = sources.ensure(version, cache_dir).root
        shutil.copytree(src, dest / src.name, copy_function=link_or_copy)


def declared_inputs(spec: dict) -> dict:
    return {name: str(i.get("default", "")) for name, i in (spec or {}).items()}


def copy_checkout(dest: Path) -> None:
    """This checkout's files as `actions/checkout` gives them: what git tracks, plus files not yet committed."""
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        src = REPO_ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.fixture(scope="module")
def runner(tmp_path_factory, cache_dir):
    """(workspace, runner temp, base environment): a downstream checkout with uv.lock pinning vLLM OLD, this
    harness at `.speculators-vllm-harness`, and the gate cache restored at `.cache/gate` as the cache step
    would (the two versions' sources hard-linked from the suite's cache: no network)."""
    from uv import find_uv_bin

    if shutil.which("git") is None:
        pytest.fail("git is needed to copy this checkout as actions/checkout would")
    root = tmp_path_factory.mktemp("runner")
    work, temp = root / "work", root / "temp"
    temp.mkdir()
    (work / ".speculators-vllm-harness").mkdir(parents=True)
    (work / "uv.lock").write_text(f'version = 1\n[[package]]\nname = "vllm"\nversion = "{OLD}"\n' + SPECULATORS_PIN)
    copy_checkout(work / ".speculators-vllm-harness")
    restore_cache(cache_dir, work / ".cache" / "gate")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HARNESS_", "GATE_", "GITHUB_", "VIRTUAL_ENV", "PYTHON", "RUNNER_"))
    }
    env.update(
        PATH=f"{os.path.dirname(find_uv_bin())}:{env.get('PATH', '')}",
        RUNNER_TEMP=str(temp),
        GITHUB_WORKSPACE=str(work),
        GITHUB_OUTPUT=str(temp / "output"),
        GITHUB_STEP_SUMMARY=str(temp / "summary.md"),
    )
    return work, temp, env


def run_step(step: dict, inputs: dict, runner, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    work, temp, env = runner
    for f in ("output", "summary.md"):
        (temp / f).unlink(missing_ok=True)
    step_env = {k: evaluate(str(v), inputs, temp) for k, v in (step.get("env") or {}).items()}
    command = evaluate(step["run"], inputs, temp)
    return subprocess.run(
        ["bash", "-e", "-c", command],
        cwd=work,
        env={**env, **(extra_env or {}), **step_env},
        capture_output=True,
        text=True,
        timeout=900,
    )


def outputs(temp: Path) -> dict:
    return dict(line.split("=", 1) for line in (temp / "output").read_text().splitlines())


def test_the_reusable_workflow_s_gate_step_with_its_relative_cache(runner, gate):
    """gate-call.yml's step as GitHub runs it: `HARNESS_GATE_CACHE: .cache/gate` relative to the workspace. It
    ended UNDECIDED (griffe could not load .cache/gate/vllm-...: File exists) while the cache path was relative."""
    spec = yaml.safe_load(WORKFLOW.read_text())
    step = next(s for s in spec["jobs"]["gate"]["steps"] if s.get("id") == "gate")
    assert step["env"]["HARNESS_GATE_CACHE"] == ".cache/gate", "the test is about the workflow's relative cache"
    on = spec.get("on", spec.get(True))  # YAML 1.1 reads a bare `on` key as True
    inputs = {**declared_inputs(on["workflow_call"]["inputs"]), "lock-file": "uv.lock", "to": NEW}
    done = run_step(step, inputs, runner)
    rc, report, _ = gate(OLD, NEW)
    assert done.returncode == rc, done.stdout[-1500:] + done.stderr[-1500:]
    got = outputs(runner[1])
    assert (got["from"], got["to"], got["verdict"]) == (OLD, NEW, report["verdict"])
    assert got["verdict"] != "UNDECIDED" and report["verdict"] in (runner[1] / "summary.md").read_text()
    assert not (runner[0] / "reports").exists(), "the step wrote into the workspace's reports/"


def test_the_composite_action_s_step_with_relative_paths(runner, gate):
    """action.yml's step: GitHub runs it from the action's folder (GITHUB_ACTION_PATH) in the caller's
    workspace; the lock file and the cache are given relative to the workspace."""
    spec = yaml.safe_load(ACTION.read_text())
    step = next(s for s in spec["runs"]["steps"] if s.get("id") == "gate")
    inputs = {**declared_inputs(spec["inputs"]), "lock-file": "uv.lock", "to": NEW}
    action_path = runner[0] / ".speculators-vllm-harness" / ".github" / "actions" / "gate"
    done = run_step(step, inputs, runner, {"GITHUB_ACTION_PATH": str(action_path), "HARNESS_GATE_CACHE": ".cache/gate"})
    rc, report, _ = gate(OLD, NEW)
    assert done.returncode == rc, done.stdout[-1500:] + done.stderr[-1500:]
    assert outputs(runner[1])["verdict"] == report["verdict"] != "UNDECIDED"


def test_a_relative_cache_dir_flag_gives_the_absolute_one_s_verdict(cache_dir, tmp_path, gate, monkeypatch):
    """`harness gate --cache-dir .cache/gate` from the folder that holds it: the verdict of the absolute path."""
    import argparse
    import json

    from harness.gate.cli import configure, run

    restore_cache(cache_dir, tmp_path / ".cache" / "gate")
    monkeypatch.chdir(tmp_path)
    args = configure(argparse.ArgumentParser()).parse_args(
        ["--from", OLD, "--to", NEW, "--cache-dir", ".cache/gate", "--json", "relative.json"]
    )
    rc = run(args)
    relative = json.loads((tmp_path / "relative.json").read_text())
    rc_abs, absolute, _ = gate(OLD, NEW)
    assert (rc, relative["verdict"]) == (rc_abs, absolute["verdict"]) and relative["verdict"] != "UNDECIDED"


def test_the_workflow_s_step_follows_the_lock_file_s_speculators_pin(runner):
    """A downstream uv.lock that pins speculators 0.8.0 beside vLLM: the reusable workflow's step judges 0.8.0's
    path (its client over `vllm serve`, with the hs-connectors 0.8.0 it declares), not 0.3.0's generator."""
    import json

    work, temp, _ = runner
    lock = work / "uv.lock"
    before = lock.read_text()
    lock.write_text(before.replace(SPECULATORS_PIN, SPECULATORS_PIN.replace("0.3.0", "0.8.0")))
    try:
        spec = yaml.safe_load(WORKFLOW.read_text())
        step = next(s for s in spec["jobs"]["gate"]["steps"] if s.get("id") == "gate")
        on = spec.get("on", spec.get(True))
        done = run_step(
            step, {**declared_inputs(on["workflow_call"]["inputs"]), "lock-file": "uv.lock", "to": NEW}, runner
        )
    finally:
        lock.write_text(before)
    rep = json.loads((temp / "gate.json").read_text())
    assert (rep.get("client"), rep.get("connectors")) == ("speculators 0.8.0", "hs-connectors 0.8.0"), (
        done.stdout[-1500:] + done.stderr[-1500:]
    )
    assert outputs(temp)["verdict"] == rep["verdict"] != "UNDECIDED"
