"""The gate's dynamic half: what the candidate vLLM's own CPU env observed, when one exists.

The matrix (`fixtures/envs/matrix.toml`, `tox -m matrix`) has one env per vLLM CPU build. When the
candidate version has one, `--dynamic` runs it (`tox -e <env>`, minutes) and the gate reads its
report; `--use-reports` reads an existing `reports/<env>.json` for that version instead. The
contracts no source can decide (coverage.OUTSIDE, e.g. `import`) take the observed outcome, and a
contract speculators relies on that the run observed worse than its expectations (broken where native
or shimmed was expected) makes the gate BROKEN whatever the static reading said. Rows that are expected
broken (e.g. vLLM's own export on CPU builds) and rows that are not speculators' calls decide nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.reporting.report import read as read_report
from harness.support.paths import REPO_ROOT, REPORTS

#: Why `dynamic_check` has nothing to say; the gate prints it next to each contract it leaves open.
NO_ENV = "no CPU env for this version"
NOT_REQUESTED = "dynamic check not requested (--dynamic or --use-reports): only the static check ran"


def env_for(version: str) -> str | None:
    from harness.envs import tox_envs

    meta = tox_envs.versions().get(version)
    return meta["env"] if meta and meta.get("runnable", True) else None


def run_env(version: str) -> int | None:
    """Run the candidate's CPU env (creating it); None when the matrix has no env for it."""
    env = env_for(version)
    if env is None:
        return None
    return subprocess.run(["tox", "-e", env], cwd=REPO_ROOT).returncode


def dynamic_check(version: str, report_dir: Path = REPORTS) -> dict | None:
    """Per-contract outcomes observed in the candidate's env, or None (see `reason`)."""
    env = env_for(version)
    path = Path(report_dir) / f"{env}.json" if env else None
    if path is None or not path.is_file():
        return None
    rep = read_report(path)
    if not rep["versions"]["vllm"].startswith(version):
        return None
    outcomes: dict[str, str] = {}
    for c in rep["contracts"]:
        cid = c["contract"].split("[")[0]
        rank = {"broken": 3, "shimmed": 2, "native": 1, "n/a": 0}
        if rank.get(c["outcome"], 0) >= rank.get(outcomes.get(cid, "n/a"), 0):
            outcomes[cid] = c["outcome"]
    from harness.contracts import ids

    relied_on = set(ids())
    worse = [
        {
            "contract": c["contract"],
            "outcome": c["outcome"],
            "expected": c.get("expected"),
            "report": path.name,
            "reason": c.get("reason"),
        }
        for c in rep["contracts"]
        if c["outcome"] == "broken" and c.get("expected") != "broken" and c["contract"].split("[")[0] in relied_on
    ]
    return {"env": env, "report": str(path.name), "status": rep["status"], "contracts": outcomes, "worse": worse}


def reason(version: str) -> str:
    env = env_for(version)
    if env is None:
        return f"{NO_ENV} (vLLM {version}): only the static check ran"
    return f"no report of env {env} for vLLM {version} yet (run `tox -e {env}` or pass --dynamic): only the static check ran"
