"""The composite action's script as a downstream job runs it (.github/actions/gate/gate.sh): it installs this
harness into a fresh virtual environment, reads the team's pin from its lock file, gates the bump, and leaves the
verdict in $GITHUB_OUTPUT and the Markdown in $GITHUB_STEP_SUMMARY: the same answer the checkout's gate gives.
Needs uv (the test extra) and the package index the first time; the vLLM sources come from the gate cache."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / ".github" / "actions" / "gate" / "gate.sh"
OLD, NEW = "0.32.0", "0.34.0"
#: The lock's speculators pin (after vLLM's, so the vllm line keeps its number): the release whose path is judged.
SPECULATORS_PIN = '[[package]]\nname = "speculators"\nversion = "0.3.0"\n'


@pytest.fixture(scope="module")
def job(tmp_path_factory, cache_dir):
    """A runner's workspace: a lock file, the step's files, an environment with uv on PATH."""
    from uv import find_uv_bin

    root = tmp_path_factory.mktemp("job")
    (root / "work").mkdir()
    (root / "work" / "uv.lock").write_text(
        f'version = 1\n[[package]]\nname = "vllm"\nversion = "{OLD}"\n' + SPECULATORS_PIN
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "GATE_", "GITHUB_", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{os.path.dirname(find_uv_bin())}:{env.get('PATH', '')}",
        RUNNER_TEMP=str(root),
        HARNESS_GATE_CACHE=str(cache_dir),
        HARNESS_VENV=str(root / "venv"),
        GITHUB_OUTPUT=str(root / "output"),
        GITHUB_STEP_SUMMARY=str(root / "summary.md"),
    )
    return root, env


def run_step(job, **inputs) -> subprocess.CompletedProcess:
    root, env = job
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=root / "work", env={**env, **inputs}, capture_output=True, text=True, timeout=900
    )


def test_the_action_gates_the_pin_of_the_lock_file(job, gate):
    root, _ = job
    step = run_step(job, GATE_LOCK_FILE="uv.lock", GATE_TO=NEW)
    rc, report, _ = gate(OLD, NEW)
    assert step.returncode == rc, step.stdout[-1500:] + step.stderr[-1500:]
    out = dict(line.split("=", 1) for line in (root / "output").read_text().splitlines())
    assert out["from"] == OLD and out["to"] == NEW and out["verdict"] == report["verdict"]
    assert out["artifact"] == f"gate-report-{OLD}-{NEW}"  # two calls with other inputs upload apart
    assert report["verdict"] in (root / "summary.md").read_text()
    assert not (root / "work" / "reports").exists(), "the step wrote outside its report path"


def test_no_pin_is_refused_in_one_line(job):
    root = job[0]
    step = run_step(job, GATE_TO=NEW)
    assert step.returncode == 2 and step.stderr.strip().count("\n") == 0, step.stderr
    assert "lock file" in step.stderr
    ranged = root / "work" / "requirements.txt"
    ranged.write_text("vllm>=0.30\n")
    (root / "output").write_text("")
    step = run_step(job, GATE_LOCK_FILE=str(ranged), GATE_TO=NEW)
    assert step.returncode == 2 and "a range, not one build" in step.stderr, step.stderr
    # The refusal reaches the job's outputs and summary, not only the log.
    out = dict(line.split("=", 1) for line in (root / "output").read_text().splitlines())
    assert out["verdict"] == "REFUSED" and "a range, not one build" in out["reason"]
    assert "REFUSED" in (root / "summary.md").read_text()


def test_a_pull_request_is_judged_from_the_base_pin_with_an_annotation_on_the_lock_file(job, gate, tmp_path):
    """The workflow's PR mode: the base ref's lock file against the head's, the verdict annotated on the line that
    pins vLLM."""
    root, env = job
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    lock = (
        'version = 1\n[[package]]\nname = "torch"\nversion = "2.9.0"\n[[package]]\nname = "vllm"\nversion = "{}"\n'
        + SPECULATORS_PIN
    )
    (repo / "uv.lock").write_text(lock.format(OLD))
    subprocess.run([*git, "add", "uv.lock"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    base = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "uv.lock").write_text(lock.format(NEW))
    (root / "output").write_text("")
    step = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, "GATE_LOCK_FILE": "uv.lock", "GATE_BASE_REF": base, "GITHUB_ACTIONS": "true"},
    )
    rc, report, _ = gate(OLD, NEW)
    assert step.returncode == rc, step.stdout[-1500:] + step.stderr[-1500:]
    out = dict(line.split("=", 1) for line in (root / "output").read_text().splitlines())
    assert (out["from"], out["to"], out["verdict"]) == (OLD, NEW, report["verdict"])
    assert f"file=uv.lock,line=6,title=speculators x vLLM gate::{report['verdict']}: vLLM {OLD} -> {NEW}" in step.stdout


def test_the_team_s_allow_list_and_index_reach_the_gate(job):
    """The inputs the action and the workflow take beside the pins (allow-list, model config, package index) are
    the gate's: an allow-list that is not there is the gate's own one-line refusal, in the outputs too; an index that
    does not answer is named where the candidate has to be looked up there."""
    root = job[0]
    (root / "output").write_text("")
    step = run_step(job, GATE_LOCK_FILE="uv.lock", GATE_TO=NEW, GATE_ALLOWLIST="team-allowlist.toml")
    out = dict(line.split("=", 1) for line in (root / "output").read_text().splitlines())
    assert step.returncode == 2 and out["verdict"] == "REFUSED" and "team-allowlist.toml" in out["reason"], step.stderr
    (root / "output").write_text("")
    step = run_step(job, GATE_LOCK_FILE="uv.lock", GATE_INDEX_URL="http://127.0.0.1:9/simple")
    out = dict(line.split("=", 1) for line in (root / "output").read_text().splitlines())
    assert step.returncode == 2 and "127.0.0.1:9" in (out.get("reason", "") + step.stderr), step.stderr[-1500:]
