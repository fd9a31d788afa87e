"""The hook for the gate's dynamic half: run the contracts' probes against the candidate vLLM for real.

The static gate reads sources; some contracts (see `coverage.OUTSIDE`) depend on what a real
environment resolves and loads. A dynamic check would build an environment with the candidate vLLM
(the CPU build, as `tox -e vllm016` does for 0.16) and run the conformance suite there. No such
environment exists for arbitrary versions yet, so the hook answers None with its reason, and the
gate reports those contracts as not checked.
"""

from __future__ import annotations

#: Why `dynamic_check` has nothing to say yet; the gate prints it next to each contract it leaves open.
NO_ENV = "no CPU env for this version"


def dynamic_check(version: str) -> dict | None:
    """Per-contract outcomes from running the candidate for real, e.g. {"contracts": {"import": "shimmed"}}.

    None when no environment for `version` can be built here (the reason is `reason(version)`).
    """
    return None


def reason(version: str) -> str:
    return f"{NO_ENV} (vLLM {version})"
