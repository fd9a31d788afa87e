"""The e2e suites' shared fixture: the session's shimmed generator of each tiny model, or the row that says why
there is none."""

from __future__ import annotations

import pytest

from harness import contracts
from harness.testing.recording import not_applicable, not_applicable_if_declared_broken


@pytest.fixture(params=contracts.E2E_MODELS)
def run(request, runs, record_e2e, expectations):
    r = runs(request.param)
    if r.absent:
        record_e2e(r.model.name, "runs on this vLLM", "n/a", r.absent)
        not_applicable(r.absent)
    if r.generator is None:
        root = contracts.start_root(r.failed.text, r.model)  # the contract the failure is the break of, if any
        said = f"{root[0]}[{r.model.subject}]: {root[1].error}" if root else r.failed.text
        record_e2e(r.model.name, "runs on this vLLM", "fail", said)
        not_applicable_if_declared_broken(expectations, r.model.name, said)
        pytest.fail(f"the shimmed generator did not start on {r.model.name}: {r.failed.text}")
    if r.refused:
        record_e2e(
            r.model.name,
            "states handed over (C-eagle3's admission: speculators' loop vs the model's own forward)",
            "fail",
            r.refused,
        )
        not_applicable_if_declared_broken(expectations, r.model.name, r.refused)
        pytest.fail(f"the generator refuses {r.model.name}'s states: {r.refused}")
    return r
