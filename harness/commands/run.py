"""`run` and `expectations`: the conformance run for the installed vLLM, the expectations it is held to, and
the run's exit code, read from its report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from harness.commands import refuse
from harness.support.cli_text import INCOMPLETE, OBSERVED
from harness.support.paths import CHECKOUT, REPORTS, SUITES, SUITES_BASE

CPU_SUITES = SUITES["cpu"]
#: `run --tp N`: the rows that exist only across ranks, and the tiny model sized for up to 8 ranks.
TP_SUITE = "suites/e2e/test_tensor_parallel.py"
TP_MODELS = "tiny-kimi-k25-tp8"
#: The matrix's quick run: every contract probe, the end-to-end checks, the native-export cross-check and the
#: client axis; no shim proofs, no bad input.
QUICK_SUITES = ("suites/contracts/test_contracts.py", "suites/e2e", "suites/native", "suites/clients")
NO_SUITES = (
    "no suites beside this harness (a wheel built without them?): reinstall speculators-vllm-harness, or run "
    "from a checkout (git clone; tox -e vllm016)"
)


def suite_args(paths) -> list[str] | None:
    """pytest's arguments for `paths` (relative to SUITES_BASE: `suites/...`), or None where the suites are missing.
    Installed, the package is the root and no configuration file of the working directory is read (the suites'
    plugin registers their markers), so a test's id and the report are the checkout's."""
    if not (SUITES_BASE / "suites" / "conftest.py").is_file():
        return None
    argv = [str(SUITES_BASE / p) for p in paths]
    if not CHECKOUT:
        argv += ["--rootdir", str(SUITES_BASE), "-c", os.devnull, "-ra", "--strict-markers"]
    return argv


def cmd_expectations(args) -> int:
    from harness.installed import versions
    from harness.reporting import expectations

    if getattr(args, "draft_from", None):
        print(expectations.draft(json.loads(Path(args.draft_from).read_text())), end="")
        return 0
    if getattr(args, "add_model", None):
        return _add_model(args.add_model, args.reports or [])
    try:
        ver = versions.vllm_version()
        path, table = expectations.load(ver, versions.device_type())
    except (versions.VllmNotInstalled, expectations.NoExpectations, expectations.BadExpectations) as e:
        return refuse(str(e))
    print(f"# {path}")
    for key, row in sorted(table.items()):
        print(f"{key:28s} {row.outcome.value:8s} {row.reason}")
    return 0


def _add_model(name: str, paths: list[str]) -> int:
    """`expectations --add-model NAME --from REPORT...`: the new fixture's rows in every CPU expectations file."""
    import datetime

    from harness.reporting import new_model
    from harness.reporting.expectations import BadExpectations
    from harness.subjects.models import load_fixture

    try:
        fixture = load_fixture(name)
        paths = paths or _observe_model(name)
        reports = [json.loads(Path(p).read_text()) for p in paths]
    except (OSError, ValueError) as e:
        return refuse(f"--add-model: {e}")
    first = fixture.get("description", name).split(": ")[0].split(". ")[0]
    header = (
        f"{first} (rows written {datetime.date.today()} by `python -m harness expectations --add-model {name}` from "
        + ", ".join(Path(p).name for p in paths)
        + ")"
    )
    try:
        from harness.reporting import class_marks

        arch = fixture["hf_config"]["architectures"][0]
        written = new_model.write(name, reports, header, marked=lambda v: class_marks.implements(v, arch))
    except (new_model.AddModelError, BadExpectations, KeyError) as e:
        return refuse(f"--add-model: {e}")
    for path, observed, predicted in written:
        print(f"{path.name}: {observed} rows observed, {predicted} PREDICTED")
    print(
        "harness: review the rows, then complete each build's report (HARNESS_RUN_ARGS=--complete tox -e vllmXYZ): "
        "a PREDICTED row a run contradicts fails that run"
    )
    return 0


def _observe_model(name: str) -> list[str]:
    """Without --from: observe the model's rows on the installed vLLM (`run --observe`, only its tests) into
    reports/add-model/, and return that report."""
    import subprocess

    folder = REPORTS / "add-model"
    env = f"{name}-observed"
    argv = [sys.executable, "-m", "harness", "run", "--env", env, "--observe", "--"]
    argv += ["-q", "--harness-report-dir", str(folder), "--harness-only-models", name]
    print(f"harness: observing {name} on the installed vLLM: {' '.join(argv[1:])}", file=sys.stderr)
    subprocess.run(argv, check=False)
    report = folder / f"{env}.json"
    if not report.is_file():
        raise OSError(f"the observation of {name} wrote no report ({report}): see its output above")
    # the observing run's draft of a whole expectations file: the rows are written below instead, per row
    (folder / f"{env}.expectations-draft.toml").unlink(missing_ok=True)
    return [str(report)]


def _expectations_for_run(args) -> int:
    """Observe (no expectations file for this vLLM, and not --strict) or hold the run to its expectations, which
    must be valid either way; nonzero: the run stops here."""
    from harness.installed import versions
    from harness.reporting import expectations
    from harness.testing.recording import observe_only

    missing = not expectations.file_for(versions.vllm_version(), versions.device_type()).is_file()
    observing = getattr(args, "observe", False) or (missing and not args.strict and not args.skip_expectation_check)
    # Decided here for this run, inherited by every process it starts; never taken from an outer run (an
    # observed run's own tests start strict runs of the CLI).
    os.environ["HARNESS_OBSERVE"] = "1" if observing else "0"
    if observing and not missing:
        print(
            "harness: --observe: recording what this vLLM shows, not holding it to its expectations (status "
            "`observed`, never pass)",
            file=sys.stderr,
        )
    elif observing:
        print(
            f"harness: no expectations for vLLM {versions.vllm_version()} ({versions.device_type()}): observing "
            "it (status `observed`, never pass); a draft expectations file is written beside the report",
            file=sys.stderr,
        )
    rc = cmd_expectations(argparse.Namespace()) if not (args.skip_expectation_check or observe_only()) else 0
    if rc:
        return rc
    if observe_only():  # observing needs no expectations, but a file that exists must still be valid
        try:
            path = expectations.file_for(versions.vllm_version(), versions.device_type())
            if path.is_file():
                expectations.load_file(path)
        except expectations.BadExpectations as e:
            return refuse(str(e))
    return 0


def cmd_run(args) -> int:
    """The conformance run for the installed vLLM: contracts, shim proofs, e2e, bad input; writes reports/<env>.*."""
    from harness.envs.tox_envs import env_refusal
    from harness.installed import versions

    try:
        versions.vllm_distribution()
    except versions.VllmNotInstalled as e:
        return refuse(str(e))
    elsewhere = any(a.startswith("--harness-report-dir") for a in args.pytest_args)  # reports/ is shared: held
    if not elsewhere and (refusal := env_refusal(args.env, versions.vllm_version())):
        return refuse(refusal)
    if args.tp > 1:  # the TP rows alone, at that size, into their own report (reports/<env>-tp<N>.*)
        args.suites = args.suites or [TP_SUITE]
        args.pytest_args = [*args.pytest_args, "--harness-tp", str(args.tp), "--harness-tp-models", args.tp_models]
        args.env = f"{args.env}-tp{args.tp}"
    from harness.support import fdio

    with tempfile.TemporaryFile() as held:
        with fdio.fds_to(held, (2,)):  # what libraries print while vLLM's platform is imported, held back:
            versions.device_type()  # a refused run says one line; an accepted one replays it below
        rc = _expectations_for_run(args)
        if rc:
            return rc
        fdio.replay(held)
    import pytest

    from harness.support import parallel

    try:
        workers = parallel.jobs(args.jobs)
    except ValueError as e:
        return refuse(str(e))
    os.environ["HARNESS_JOBS"] = "1"  # the runs this run's own tests start (bad input) are one process each
    if getattr(args, "complete", False):
        narrowed = _rows_to_complete(args.env, args.pytest_args)
        if isinstance(narrowed, int):
            return narrowed
        args.pytest_args = [*args.pytest_args, *narrowed]
    argv = suite_args(args.suites or (QUICK_SUITES if args.quick else CPU_SUITES))
    if argv is None:
        return refuse(NO_SUITES)
    argv += ["--harness-env", args.env, "-p", "no:cacheprovider", *parallel.pytest_args(workers), *args.pytest_args]
    rc = int(pytest.main(argv))
    from harness.testing.collector import COLLECTOR

    rep = COLLECTOR.last_report
    if rep is not None and rep["status"] == "observed":
        from harness.reporting.report_markdown import observed_summary

        print(observed_summary(rep))
    return exit_code(rc, rep)


def _report_dir(pytest_args: list[str]) -> Path:
    """Where the run's report goes: `--harness-report-dir` among the pytest arguments (either form), else reports/."""
    for i, a in enumerate(pytest_args):
        if a.startswith("--harness-report-dir="):
            return Path(a.split("=", 1)[1])
        if a == "--harness-report-dir" and i + 1 < len(pytest_args):
            return Path(pytest_args[i + 1])
    return REPORTS


def _rows_to_complete(env: str, pytest_args: list[str]) -> list[str] | int:
    """The pytest arguments narrowing a run to what the env's complete report lacks; an exit code where there is
    nothing to run (0: the report lacks nothing) or nothing to complete (2: no complete report of this vLLM)."""
    from harness import contracts
    from harness.installed import versions
    from harness.reporting.report import complete_run, read
    from harness.testing import rows

    path = _report_dir(pytest_args) / f"{env}.json"
    try:
        rep = read(path)
    except (OSError, ValueError) as e:
        return refuse(f"--complete needs the env's complete report to complete: cannot read {path} ({e})")
    if not complete_run(rep):
        return refuse(f"--complete: {path} is not the report of a complete run (run `tox -e {env}` first)")
    if rep["versions"].get("vllm") != versions.vllm_version():
        return refuse(
            f"--complete: {path} is of vLLM {rep['versions'].get('vllm')}, the installed one is "
            f"{versions.vllm_version()}"
        )
    wanted = rows.missing(rep, contracts.keys(), contracts.E2E_MODELS)
    if not wanted:
        print(f"harness: {path.name} lacks no row of the suite: nothing to complete", file=sys.stderr)
        return 0
    print(f"harness: completing {path.name}: {wanted.describe()}", file=sys.stderr)
    return wanted.args()


def exit_code(pytest_rc: int, rep: dict | None) -> int:
    """The run's exit code from its report: pass 0, fail 1, incomplete 3 -- or 0 where the only thing missing
    is what the user left out on purpose (a subset), never after an interruption."""
    if rep is None:
        return pytest_rc
    if rep["status"] == "fail":
        return 1
    if rep["status"] == "observed":  # an observation cut short is incomplete first
        stopped = {g["kind"] for g in rep.get("incomplete") or []} & {"interrupted", "stopped"}
        return INCOMPLETE if stopped else OBSERVED
    if rep["status"] == "incomplete":
        kinds = {g["kind"] for g in rep["incomplete"]}
        asked = "subset" in kinds and not kinds & {"interrupted", "stopped"}
        return 0 if asked and pytest_rc == 0 else INCOMPLETE
    return pytest_rc


def add_run(sub) -> None:
    """`run`."""
    r = sub.add_parser("run", help="the conformance run for the installed vLLM (writes reports/<env>.json/.md)")
    r.add_argument(
        "--env",
        default=os.environ.get("HARNESS_ENV", "local"),
        help="the report's name: reports/<env>.json/.md (default $HARNESS_ENV, else local)",
    )
    r.add_argument("--suite", dest="suites", action="append", help="suite folder(s); default: the CPU suites")
    r.add_argument("--quick", action="store_true", help="contract probes and e2e only (the matrix's run)")
    r.add_argument(
        "--complete",
        action="store_true",
        help="row completion: run only the tests observing the rows reports/<env>.json lacks (contracts and tiny "
        "models added since it was written); the matrix folds them into that build's column, each row marked with "
        "this run and its machine",
    )
    r.add_argument(
        "--jobs",
        default=os.environ.get("HARNESS_JOBS", "1"),
        help="pytest-xdist workers: a number, or auto (a worker per 2 cores, bounded by available memory; "
        "harness.support.parallel). Default 1: on 2 cores two workers were slower",
    )
    r.add_argument(
        "--tp",
        type=int,
        default=1,
        help="run only the tensor-parallel rows at this size (CPU build: ranks bound to cores, memory checked), into "
        "reports/<env>-tp<N>.*; e.g. --tp 8",
    )
    r.add_argument("--tp-models", default=TP_MODELS, help=f"with --tp: the tiny models (default {TP_MODELS})")
    r.add_argument(
        "--observe",
        action="store_true",
        help="record what this vLLM shows without holding it to its expectations (status `observed`, never pass): "
        "the first run of a new tiny model, whose rows `expectations --add-model` then writes",
    )
    r.add_argument("--skip-expectation-check", action="store_true", help=argparse.SUPPRESS)
    r.add_argument(
        "--strict",
        action="store_true",
        help="refuse a vLLM without an expectations file (exit 2) instead of observing it",
    )
    r.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    r.set_defaults(fn=cmd_run)


def add_expectations(sub) -> None:
    """`expectations`."""
    e = sub.add_parser("expectations", help="print the expectations for the installed vLLM")
    e.add_argument("--draft-from", help="print a draft expectations file from an env report (review before committing)")
    e.add_argument(
        "--add-model",
        metavar="FIXTURE",
        help="write a new tiny model's rows into every CPU expectations file: observed on the installed vLLM (or "
        "in the --from reports), PREDICTED for every other build",
    )
    e.add_argument(
        "--from",
        dest="reports",
        nargs="+",
        metavar="REPORT",
        help="with --add-model: reports that observed the model (default: observe it on the installed vLLM now, "
        "into reports/add-model/)",
    )
    e.set_defaults(fn=cmd_expectations)
