"""Each shim is needed and sufficient, shown with speculators' own generator on this vLLM.

For every contract row that has a shim (`harness.contracts.proof_keys()`, derived from the contract modules):
start speculators' `VllmHiddenStatesGenerator` (through the harness, with every other shim on) with that one
shim left out, and extract a batch twice. Where the expectations say the row is shimmed, that run must fail
with the failure the contract documents (needed); the shimmed run of the same batch is the end-to-end suite
(sufficient). Where the row is native, the run without the shim must pass (not needed here). Each result is
recorded on the contract's row of the env report (`proof`), so a report without it is incomplete, not green.
"""

from __future__ import annotations

import os
import re
import tempfile

import pytest

from harness import contracts
from harness.contracts.base import Attempt, Outcome, summarize
from harness.reporting.report import PROOF_FAILED, PROOF_NA, PROOF_NEEDED, PROOF_NOT_NEEDED
from harness.support import fdio
from harness.testing.recording import not_applicable, observe_only, outcome_to_prove

PROMPTS = [[(7 * i + 3 * j) % 500 + 4 for j in range(40)] for i in range(2)]  # 2 full blocks and more each


def _extract(name: str, disable: frozenset, calls: int = 2, run=None):
    """speculators' generator with `disable` left out: `calls` extractions of PROMPTS, or the contract's own
    `proof_run(gen)` (a batch and a check the contract needs, e.g. C-chunkedprefill's request order)."""
    from harness.runtime.generator import HarnessGenerator, options_for
    from harness.subjects import models
    from harness.testing.probe_context import MAX_MODEL_LEN

    model = models.build(name)
    with HarnessGenerator(
        model.path, [1, 2], max_model_len=MAX_MODEL_LEN, disable=disable, options=options_for(model)
    ) as gen:
        if run is not None:
            return run(gen)
        for _ in range(calls):
            results = gen.generate(PROMPTS)
    return results


def _model_for(key: str) -> str:
    """The tiny model a proof runs on: the row's own model for per-model rows (keyed by fixture), else the
    suite's global model."""
    return key.split("[")[1].rstrip("]") if "[" in key else contracts.global_model()


def _without_shim(cid: str, name: str) -> Attempt:
    """speculators' run with this one shim left out (the contract module may say how: `prove(with_shim)`)."""
    from harness.contracts import mla
    from harness.subjects import models

    module = contracts.by_id()[cid]
    if hasattr(module, "prove"):
        return module.prove(False)
    if cid == mla.CONTRACT.id:
        return _start_with_mla_on(models.build(name))
    mla.prepare(models.build(name))
    context = getattr(module, "PROOF_CONTEXT", frozenset())
    without, _ = Attempt.run(lambda: _extract(name, frozenset({cid}) | context, run=getattr(module, "proof_run", None)))
    return without


def _sufficient_alone(cid: str, name: str) -> Attempt | None:
    """With its shim on but a context shim left out (C-request needs prefix caching left on to fail): one call.
    None where the shimmed run is the end-to-end suite itself."""
    module = contracts.by_id()[cid]
    if hasattr(module, "prove"):
        return module.prove(True)
    context = getattr(module, "PROOF_CONTEXT", frozenset())
    if not context:
        return None
    alone, _ = Attempt.run(lambda: _extract(name, context, calls=1))
    return alone


@pytest.mark.parametrize("key", contracts.proof_keys())
def test_shim_needed_and_sufficient(key, expectations, record_proof, record_note):
    cid, name = key.split("[")[0], _model_for(key)
    module = contracts.by_id()[cid]
    exp = outcome_to_prove(key, expectations)
    if exp is None and observe_only():
        pytest.skip(f"{key} was not observed in this run: no outcome to prove its shim against")
    assert exp is not None, f"no expectation for {key}"
    if exp.outcome not in (Outcome.NATIVE, Outcome.SHIMMED):
        why = f"{key} is expected {exp.outcome} on this vLLM ({exp.reason}): there is no working shim to prove"
        record_proof(key, PROOF_NA, why)
        not_applicable(why)
    without = _without_shim(cid, name)
    if exp.outcome is Outcome.NATIVE:
        record_proof(
            key, PROOF_NOT_NEEDED if without.ok else PROOF_FAILED, f"without {module.CONTRACT.shim}: {without.text}"
        )
        assert without.ok, f"{key} is expected native, yet speculators fails without its shim: {without.text}"
        return
    documented = module.CONTRACT.documented(without)
    alone = _sufficient_alone(cid, name) if documented else None
    ok = documented and (alone is None or alone.ok)
    record_proof(
        key,
        PROOF_NEEDED if ok else PROOF_FAILED,
        f"without {module.CONTRACT.shim}: {without.text}"
        + (f"; with it: {alone.text}" if alone is not None else "; with it: the end-to-end suite"),
    )
    assert not without.ok, f"{key}: speculators works without shim {module.CONTRACT.shim}: the shim is not needed"
    assert documented, f"{key}: without its shim speculators fails, but not with the documented failure: {without.text}"
    assert alone is None or alone.ok, f"{key}: with its shim (the context shims left out) it still fails: {alone.text}"
    record_note(
        f"shim proof {key}: without {module.CONTRACT.shim}: {without.text[:160]}"
    )  # an Attempt's error is normalised already


def _start_with_mla_on(model) -> Attempt:
    """C-mla's run without its shim: start the model with MLA on. The root cause is logged by the worker, not
    raised in the driver, so the workers get a log file (spawned workers inherit stdout and stderr)."""
    from harness.contracts import mla
    from harness.runtime.generator import HarnessGenerator, options_for

    saved_env = os.environ.pop(mla.ENV, None)
    with tempfile.TemporaryFile(mode="w+") as log:
        try:
            with fdio.fds_to(log):
                start, gen = Attempt.run(
                    lambda: HarnessGenerator(
                        model.path, [1], max_model_len=256, options=options_for(model, dtype="float32")
                    )
                )
        finally:
            if saved_env is not None:
                os.environ[mla.ENV] = saved_env
        if gen is not None:
            gen.close()
        log.seek(0)
        worker_log = log.read()
    if start.ok:
        return start
    documented = [
        line.strip() for line in worker_log.splitlines() if any(re.search(p, line) for p in mla.CONTRACT.failures)
    ]
    return Attempt.failed(
        start.error_type or "RuntimeError",
        (summarize(documented[-1], 300) + " (worker log)") if documented else start.error or "",
        **start.detail,
    )
