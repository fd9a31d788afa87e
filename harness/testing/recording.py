"""Fixtures that record what a test observed, and the strict check against the expectations.

Every contract observation recorded through `record_observation` is held to its expectation there and then
(one place: a test cannot forget the check); observe mode (`HARNESS_OBSERVE=1`) records without holding."""

from __future__ import annotations

import os

import pytest

from harness.support import volatile
from harness.testing.collector import COLLECTOR, E2E, META, NOTE, OBS, PROOF

#: A skip whose reason starts with this is a declared n/a (the thing tested does not apply here, said why);
#: any other skip leaves the run incomplete.
NA_PREFIX = "n/a: "


def not_applicable(reason: str):
    """Skip a test because what it checks does not apply here (declared; the run can still pass)."""
    pytest.skip(NA_PREFIX + reason)


def not_applicable_if_declared_broken(expectations, model_name: str, failure: str) -> None:
    """n/a when this vLLM's expectations declare the model's e2e broken (vLLM's fault, declared) and it failed."""
    exp = expectations["table"].get(f"e2e[{model_name}]")
    if exp is not None and exp.outcome.value == "broken":
        not_applicable(f"expected broken on this vLLM ({exp.reason}), and it reproduces: {failure}")


@pytest.fixture(scope="session")
def harness_meta() -> dict:
    from harness.installed import versions

    return versions.snapshot()


def observe_only() -> bool:
    """HARNESS_OBSERVE=1 (set by `harness run` for a vLLM without an expectations file): record what it
    shows without holding it to expectations. The report's status is `observed`, never pass, and a draft
    expectations file is written beside it for review."""
    return os.environ.get("HARNESS_OBSERVE") == "1"


@pytest.fixture(scope="session")
def expectations(harness_meta):
    from harness.reporting import expectations as exp

    if observe_only():
        return {"path": "none (HARNESS_OBSERVE=1)", "table": {}}
    try:
        path, table = exp.load(harness_meta["vllm"], harness_meta["device_type"])
    except exp.BadExpectations as e:
        pytest.exit(f"harness: {e}", returncode=2)
    return {"path": str(path.name), "table": table}


@pytest.fixture
def record_observation(request, expectations, harness_meta):
    """`record(obs)`: the observation goes into the env report, and is held to its expectation (strict).
    `hold=False` only where a caller collects every row before failing (the GPU tier's report)."""

    def record(obs, hold: bool = True) -> None:
        data = obs.to_json()
        exp = expectations["table"].get(obs.key)
        data["expected"] = str(exp.outcome) if exp else None
        data["expected_reason"] = exp.reason if exp else None
        data["expectations_file"] = expectations["path"]
        request.node.user_properties.append((OBS, data))
        request.node.user_properties.append((META, harness_meta))
        if hold:
            check_expected(obs, expectations)

    return record


@pytest.fixture
def record_e2e(request):
    def record(model: str, check: str, result: str, measured: str = "", **values) -> None:
        request.node.user_properties.append(
            (E2E, {"model": model, "check": check, "result": result, "measured": measured, **values})
        )

    return record


@pytest.fixture
def record_proof(request):
    """`record(key, result, text)`: a shim proof's result for contract row `key` (see harness.reporting.report.PROOF_*)."""

    def record(key: str, result: str, text: str = "") -> None:
        request.node.user_properties.append(
            (PROOF, {"contract": key, "result": result, "evidence": volatile.text(text)[:400]})
        )

    return record


@pytest.fixture
def record_note(request):
    def record(text: str) -> None:
        request.node.user_properties.append((NOTE, volatile.text(text)))

    return record


def outcome_to_prove(key: str, expectations):
    """What a shim proof holds contract row `key` to: its expectation; where a build is observed without
    expectations, the outcome this run's probe of the row observed (None when the row was not observed)."""
    if not observe_only():
        return expectations["table"].get(key)
    from harness.contracts.base import Outcome
    from harness.reporting.expectations import Expectation

    data = COLLECTOR.observations.get(key)
    if data is None:
        return None
    return Expectation(key, Outcome(data["outcome"]), f"observed by this run's probe: {data.get('reason', '')}")


def check_expected(obs, expectations) -> None:
    """Strict: the observed outcome must be the expected one, and an expectation must exist."""
    if observe_only():
        return
    exp = expectations["table"].get(obs.key)
    if exp is None:
        pytest.fail(f"{obs.key}: no expectation in {expectations['path']}; observed {obs.outcome} ({obs.reason})")
    assert obs.outcome == exp.outcome, (
        f"{obs.key}: expected {exp.outcome} ({exp.reason}); observed {obs.outcome}: {obs.reason}"
    )
    selected = obs.facts.get("shim_selected")
    if isinstance(selected, bool):
        assert selected == (obs.outcome.value == "shimmed"), (
            f"{obs.key}: the harness's probing selects the shim={selected}, but the contract is {obs.outcome}"
        )


@pytest.fixture
def numerics_expected(expectations):
    """`check(model, ok, measured)` for a comparison with transformers: it must hold, unless the expectations
    say this vLLM computes wrong numbers for the model (e2e[model] = broken); then it must still fail (strict:
    an unexpected pass fails, as everywhere else)."""

    def check(model: str, ok: bool, measured: str) -> None:
        exp = expectations["table"].get(f"e2e[{model}]")
        if observe_only() or exp is None or exp.outcome.value != "broken":
            assert ok, measured
            return
        assert not ok, f"e2e[{model}] is expected broken ({exp.reason}) but the numbers now match: {measured}"

    return check


def expected_broken(expectations, model: str) -> bool:
    exp = expectations["table"].get(f"e2e[{model}]")
    return exp is not None and exp.outcome.value == "broken" and not observe_only()
