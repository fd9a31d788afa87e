"""The gate's observation step (after obtain and read, before the decision): the candidate run on what the static
reading says changed.

`owners` says which report rows settle each contract and watched path; `candidate` installs the candidate and runs
the suite narrowed to those rows; `harness.gate.decide.observed` turns the rows into the verdict. Two sources of
rows:
- `--dynamic`: a targeted run of the candidate (minutes: the owning contracts' probes and shim proofs and the
  end-to-end extraction on one tiny model, not the whole env);
- `--use-reports`: the complete report of the same build in reports/ (the matrix's run), read, not run.
The baseline's rows (what `--from` observed) come from its committed report where there is one: a row broken there
too is not the bump's.
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.gate.decide.observed import Observation, judge
from harness.gate.observe import candidate, owners
from harness.support.paths import REPORTS

NOT_REQUESTED = "not requested (--dynamic runs the candidate; --use-reports reads its build's report)"


def committed_report(version: str, report_dir: Path = REPORTS) -> tuple[dict | None, str]:
    """The complete report of a release's CPU build in `report_dir` (the matrix's run), or None and why not."""
    from harness.envs import tox_envs
    from harness.reporting.report import complete_run, read

    meta = tox_envs.versions().get(version)
    if meta is None:
        return None, f"no CPU env of the matrix for vLLM {version}"
    path = Path(report_dir) / f"{meta['env']}.json"
    if not path.is_file():
        return None, f"no report reports/{path.name} (run `tox -e {meta['env']}`)"
    rep = read(path)
    if not rep["versions"].get("vllm", "").startswith(version.split("+")[0]) or not complete_run(rep):
        return None, f"reports/{path.name} is not a complete run of vLLM {version}"
    from harness.reporting.matrix import fold_supplement

    extra = path.with_name(f"{meta['env']}.incomplete.json")  # rows a row-completion run added, as the matrix
    return rep, f"reports/{path.name}" + (f" + reports/{extra.name}" if fold_supplement(rep, extra) else "")


def from_reports(gate, new: str, old: str, report_dir: Path = REPORTS) -> Observation:
    """The wanted rows as the matrix's complete run of the candidate observed them (`--use-reports`)."""
    wanted = owners.wanted(gate)
    rep, where = committed_report(new, report_dir)
    if rep is None:
        return Observation(where, error=where)
    baseline, _ = committed_report(old, report_dir)
    return judge(sorted(wanted.rows), rep, baseline, where)


def run(gate, kind: str, label: str, location: str, old: str, cache_dir: Path, log=print) -> Observation:
    """The wanted rows observed by a targeted run of the candidate (`--dynamic`)."""
    wanted = owners.wanted(gate)
    t0 = time.perf_counter()
    try:
        install = candidate.plan(kind, label, location)
        folder, made_s = candidate.ensure_env(install, cache_dir, log)
        log(f"gate: observing {label} on {wanted.describe()}")
        rep, run_s = candidate.run_rows(install, folder, wanted.args())
    except candidate.CannotRun as exc:
        return Observation("a targeted run of the candidate", error=str(exc), seconds=round(time.perf_counter() - t0))
    baseline, _ = committed_report(old)
    obs = judge(sorted(wanted.rows), rep, baseline, f"a targeted run of {label} ({install.key})")
    obs.seconds = round(time.perf_counter() - t0, 1)
    obs.timings = {"env_made_s": made_s, "run_s": run_s}
    return obs
