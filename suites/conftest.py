"""Shared fixtures: the tiny models, and one shimmed generator per model for the whole session.

Starting an executor (a worker process and a model load) is what costs time on CPU, so probes,
end-to-end checks and bad-input tests share one generator per model; tests that must break a
generator (shim proofs, the hung worker) start their own and always close it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest_plugins = ["harness.testing.plugin", "harness.testing.ahead"]


@dataclass
class ModelRun:
    model: object
    generator: object
    ctx: object
    mla: object  # the C-mla observation made while starting
    absent: str | None = None  # why this vLLM cannot run the model at all (e.g. no such architecture yet)
    failed: object = None  # the start attempt, when the shimmed generator could not start

    @property
    def refused(self) -> str | None:
        """Why the generator refuses this model's states (C-eagle3's admission check at start), or None."""
        return None if self.generator is None else self.generator.refused

    def unavailable(self, contract):
        """The observation for a per-model contract when no generator runs: n/a (architecture absent from
        this vLLM) or broken (it did not start through the shims)."""
        from harness import contracts
        from harness.contracts.base import NOT_OBSERVED, Attempt, Observation

        if self.absent:
            return Observation(
                contract, Attempt(True), None, {}, not_applicable=self.absent, subject=self.model.subject
            )
        facts = {"start": self.failed.text}
        root = contracts.start_root(self.failed.text, self.model)
        if root is None:
            why = Attempt.failed("GeneratorDidNotStart", f"the shimmed generator did not start: {self.failed.text}")
        elif root[0] == contract.id:
            why = root[1]
        else:
            why = Attempt.failed(NOT_OBSERVED, f"the generator did not start, see {root[0]}[{self.model.subject}]")
        return Observation(contract, why, None, facts, subject=self.model.subject)


def _start(name: str) -> ModelRun:
    from harness.contracts import mla
    from harness.runtime.generator import HarnessGenerator, options_for
    from harness.subjects import models
    from harness.testing.probe_context import MAX_MODEL_LEN, ProbeContext

    model = models.build(name)
    tc = model.text_config
    absent = model.absent_from_vllm()
    if absent:
        return ModelRun(model, None, None, None, absent=absent)
    gen, start, with_env, mla_start = mla.start(
        model,
        lambda: HarnessGenerator(
            model.path,
            list(model.probe_layers),
            max_model_len=MAX_MODEL_LEN,
            options=options_for(model, dtype="float32"),
        ),
    )
    observed = mla.probe(model.subject, tc, with_env, start, mla_start=mla_start)
    if not start.ok:
        return ModelRun(model, None, None, observed, failed=start)
    return ModelRun(model, gen, ProbeContext(model, gen), observed)


@pytest.fixture(scope="session")
def runs():
    """`runs(name)`: the session's shared ModelRun for a tiny model, started on first use (and again after it
    was closed to make room for another: harness.testing.room)."""
    from harness.support.processes import adopt_session_processes
    from harness.testing import room

    started: dict[str, ModelRun] = {}  # in order of last use, oldest first

    def close(run: ModelRun) -> None:
        if run.generator is not None:
            run.ctx.close()
            run.generator.close()

    def get(name: str) -> ModelRun:
        if name not in started:
            live = [(n, r.generator) for n, r in started.items() if r.generator is not None]
            for other in room.to_close(live):
                close(started.pop(other))
            started[name] = _start(name)
            adopt_session_processes()
        started[name] = started.pop(name)  # most recently used last
        return started[name]

    yield get
    from harness.testing.leaks import FIRST_SEEN, shm_entries

    before = shm_entries()
    for run in started.values():
        close(run)
    for name in shm_entries() - before:  # named by the session's /dev/shm check if it is left
        FIRST_SEEN.setdefault(name, "closing the session's shared generators")


def pytest_collection_modifyitems(config, items):
    """Under xdist (--dist loadgroup) keep the tests of one shared generator on one worker."""
    for item in items:
        uses = item.fixturenames
        if "runs" not in uses and "run" not in uses:
            continue
        name = getattr(item, "callspec", None) and (item.callspec.params.get("name") or item.callspec.params.get("run"))
        item.add_marker(pytest.mark.xdist_group(name or "tiny-llama"))
