"""Every contract, probed against the installed vLLM and held to fixtures/expectations (strict)."""

from __future__ import annotations

import pytest

from harness import contracts

MODEL_CONTRACTS = [c for c in contracts.PER_MODEL if c != "mla"]


@pytest.mark.parametrize("cid", contracts.global_ids())
def test_contract(cid, runs, record_observation, expectations):
    run, module = runs(contracts.global_model()), contracts.by_id()[cid]
    obs = run.unavailable(module.CONTRACT) if run.generator is None else module.probe(run.ctx)
    record_observation(obs)  # held to its expectation there


@pytest.mark.parametrize("name", contracts.E2E_MODELS)
@pytest.mark.parametrize("cid", MODEL_CONTRACTS)
def test_model_contract(cid, name, runs, record_observation, expectations):
    run = runs(name)
    module = contracts.by_id()[cid]
    obs = run.unavailable(module.CONTRACT) if run.generator is None else module.probe(run.ctx)
    record_observation(obs)  # held to its expectation there


@pytest.mark.parametrize("name", contracts.E2E_MODELS)
@pytest.mark.parametrize("cid", ["mla"])  # the row it observes, as a parameter (harness.testing.rows reads it)
def test_mla_platform(cid, name, runs, record_observation, expectations, record_note):
    run = runs(name)
    obs = run.unavailable(contracts.by_id()[cid].CONTRACT) if run.absent else run.mla
    if obs.facts.get("ran_with_VLLM_MLA_DISABLE"):
        record_note(
            f"{name}: MLA cannot run on this platform ({obs.unshimmed.text}); the run uses "
            "VLLM_MLA_DISABLE=1 (MLA expanded to multi-head attention over the same weights)"
        )
    record_observation(obs)  # held to its expectation there
