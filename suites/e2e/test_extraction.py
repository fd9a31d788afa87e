"""speculators 0.3.0's own generator, through the shims, on the tiny models: shapes, numbers, determinism.

Reference: transformers' forward over the same checkpoint files in float64 (see harness.subjects.reference for the
layer convention; transformers runs its eager attention). The bound is derived from the reference's own error on
the same prompts (`harness.subjects.reference.against`: SLACK x transformers' float32-vs-float64 difference, never
below SLACK float32 ulps of the largest state), so a family whose states are large (Gemma-3's reach ~30) gets the
room its float32 rounding takes and no more:

* vs transformers `hidden_states[k + 1]` in float64: within that bound.
* vs `hidden_states[k]`, the off-by-one: must differ by more than 1e-2 (it differs by ~1).
* the same batch twice: bitwise equal. A prompt alone vs inside a batch: `reference.tolerance` over the batch's
  states (batch shapes change the matmul blocking, so bitwise equality is not promised).
"""

from __future__ import annotations

import pytest
import torch

from harness import contracts
from harness.subjects import batches, reference
from harness.subjects.prompts import random_prompts
from harness.testing.recording import expected_broken, not_applicable

OFF_BY_ONE_MIN = 1e-2


def max_diff(results, refs) -> float:
    return max(
        float((h.float() - r).abs().max())
        for res, ref in zip(results, refs, strict=True)
        for h, r in zip(res["hidden_states"], ref, strict=True)
    )


def states_against_reference(results, path, batch, layer_ids) -> reference.Comparison:
    return reference.against([r["hidden_states"] for r in results], path, batch, layer_ids)


def test_batch_matches_transformers(run, record_e2e, numerics_expected):
    """A multi-prompt batch (17..131 tokens, several blocks each): shapes, and equality with transformers."""
    model, gen = run.model, run.generator
    batch = random_prompts(6, 17, 131, model.vocab_size, seed=1)
    results = gen.generate(batch)
    assert len(results) == len(batch)
    for p, res in zip(batch, results, strict=True):
        assert len(res["hidden_states"]) == len(gen.layer_ids)
        for h in res["hidden_states"]:
            assert tuple(h.shape) == (len(p), model.hidden_size)
            assert h.dtype == torch.float32 and torch.isfinite(h).all()
        assert res["input_ids"].tolist() == p
    c = states_against_reference(results, model.path, batch, gen.layer_ids)
    record_e2e(
        model.name,
        "vs transformers hidden_states[k+1], float64",
        "pass" if c.held else "fail",
        f"{c.said()}; layers {gen.layer_ids}",
        max_abs_diff=c.diff,
    )
    numerics_expected(model.name, c.held, c.said())
    if not c.held:
        return  # expected broken here (checked above): the off-by-one guard needs correct numbers

    off = max_diff(results, reference.hidden_states(model.path, batch, gen.layer_ids, offset=0))
    record_e2e(
        model.name,
        "off-by-one guard: vs hidden_states[k] must differ",
        "pass" if off > OFF_BY_ONE_MIN else "fail",
        f"max abs diff {off:.3g} (must exceed {OFF_BY_ONE_MIN:g})",
        max_abs_diff=off,
    )
    assert off > OFF_BY_ONE_MIN, "the layer offset is not observable: the comparison would not catch an off-by-one"


def test_same_batch_twice_is_bitwise_equal_and_complete(run, record_e2e):
    """The same batch again (a second generate() over prompts already seen): all rows, same bits."""
    batch = random_prompts(4, 17, 100, run.model.vocab_size, seed=2)
    first = run.generator.generate(batch)
    second = run.generator.generate(batch)
    rows = [[int(h.shape[0]) for h in r["hidden_states"]] for r in second]
    assert rows == [[len(p)] * len(run.generator.layer_ids) for p in batch], "prefix cache ate rows"
    equal = all(
        torch.equal(a, b)
        for r1, r2 in zip(first, second, strict=True)
        for a, b in zip(r1["hidden_states"], r2["hidden_states"], strict=True)
    )
    record_e2e(
        run.model.name,
        "same batch twice: all rows, bitwise equal",
        "pass" if equal else "fail",
        f"{sum(map(len, batch))} tokens x {len(run.generator.layer_ids)} layers",
    )
    assert equal


def test_many_prompts_over_several_scheduler_steps(run, record_e2e, numerics_expected):
    """40 prompts of 17..134 tokens: more than speculators' 32 sequences per step, so several steps."""
    model, gen = run.model, run.generator
    batch = random_prompts(40, 17, 134, model.vocab_size, seed=3)
    steps_before = gen.executor_view.steps
    results = gen.generate(batch)
    c = states_against_reference(results, model.path, batch, gen.layer_ids)
    tokens = sum(map(len, batch))
    record_e2e(
        model.name,
        "40 prompts, several scheduler steps, vs transformers",
        "pass" if c.held else "fail",
        f"{tokens} tokens; {c.said()}",
        max_abs_diff=c.diff,
        tokens=tokens,
    )
    numerics_expected(model.name, c.held, c.said())
    assert gen.executor_view.steps - steps_before >= 2, (
        "the batch fit in one scheduler step: nothing multi-step was tested"
    )


def test_batch_several_times_the_step_budget(run, record_e2e, numerics_expected):
    """A training-sized batch: ~3x max_num_batched_tokens of 250..350-token prompts, so prompts straddle step
    boundaries (C-chunkedprefill): every row present, in order, equal to transformers."""
    from harness.contracts import chunkedprefill

    model, gen = run.model, run.generator
    sc = gen.vllm_config.scheduler_config
    budget = int(sc.max_num_batched_tokens)
    batch = random_prompts(3 * budget // 300, 250, 350, model.vocab_size, seed=5)
    guard = getattr(gen.scheduler, chunkedprefill.GUARD)
    steps_before, kept_before = gen.executor_view.steps, guard.kept
    results = gen.generate(batch)
    tokens, steps, kept = sum(map(len, batch)), gen.executor_view.steps - steps_before, guard.kept - kept_before
    assert [r["input_ids"].tolist() for r in results] == batch
    c = states_against_reference(results, model.path, batch, gen.layer_ids)
    # Where the KV cache holds fewer tokens than one step's budget, the cache binds first: the scheduler stops
    # admitting prompts instead of chunking one, so nothing straddles (seen for the MLA fixtures run as MHA on CPU).
    kv_tokens = int(gen.scheduler.kv_cache_config.num_blocks) * int(gen.vllm_config.cache_config.block_size)
    straddles = chunkedprefill.chunked(sc) and kv_tokens > budget + 350
    record_e2e(
        model.name,
        "batch of 3x the step budget, prompts straddling steps, vs transformers",
        "pass" if c.held else "fail",
        f"{len(batch)} prompts, {tokens} tokens, {steps} steps "
        f"(budget {budget}, KV cache {kv_tokens} tokens), {kept} prompts continued across a step"
        + ("" if straddles else " (the KV cache binds before the budget: no straddle possible here)")
        + f"; {c.said()}",
        max_abs_diff=c.diff,
        tokens=tokens,
        steps=steps,
        straddled=kept,
    )
    assert tokens > 2 * budget and steps >= 3
    if straddles:
        assert kept > 0, "no prompt straddled a step boundary: the batch did not test chunked prefill"
    numerics_expected(model.name, c.held, c.said())


def test_prompt_alone_equals_prompt_in_batch(run, record_e2e, numerics_expected, expectations):
    """Batch invariance. Where this vLLM is expected to compute the model wrongly, invariance of wrong numbers
    says nothing: the test then requires that the batch still differs from transformers (the break reproduces)."""
    model, gen = run.model, run.generator
    batch = random_prompts(5, 20, 90, model.vocab_size, seed=4)
    together = gen.generate(batch)
    alone = gen.generate([batch[2]])
    d = max(
        float((a - b).abs().max()) for a, b in zip(alone[0]["hidden_states"], together[2]["hidden_states"], strict=True)
    )
    tol = reference.tolerance([r["hidden_states"] for r in together])
    record_e2e(
        model.name,
        "a prompt alone vs inside a batch",
        "pass" if d <= tol else "fail",
        f"max abs diff {d:.2e} (tolerance {tol:g})",
        max_abs_diff=d,
    )
    if expected_broken(expectations, model.name):
        c = states_against_reference(together, model.path, batch, gen.layer_ids)
        numerics_expected(model.name, c.held, f"vs transformers: {c.said()}")
        return
    assert d <= tol, f"max abs diff {d:.2e} > {tol:g}"


@pytest.mark.parametrize("name", contracts.E2E_MODELS)
def test_a_broken_cell_says_whose_fault_it_is(name, runs, expectations, record_e2e):
    """Where e2e[model] is expected broken, the same model through plain vLLM (no speculators, no shims) must be
    wrong too -- or not start: then the cell is vLLM's. Plain vLLM right would make it our bug, and fails here."""
    from harness.reporting import attribution

    if not expected_broken(expectations, name):
        not_applicable(f"e2e[{name}] is not expected broken on this vLLM: nothing to attribute")
    r = runs(name)  # decides MLA for this platform first, as every run of the model does
    if r.absent:
        not_applicable(r.absent)
    verdict = attribution.attribute(r.model, random_prompts(4, 17, 60, r.model.vocab_size, seed=9))
    forward = expectations["table"].get(f"forward[{name}]")
    if forward is not None and forward.outcome.value == "broken":
        # speculators' own path is declared not to give this model's states (C-forward, or a start that failed on
        # speculators' layer call): then plain vLLM must be right, and the cell is speculators'
        says = verdict.says(r.model.architecture, speculators_cause=speculators_cause(r, name))
        holds = verdict.started.ok and not verdict.vllm_wrong
    else:
        says, holds = verdict.says(r.model.architecture), verdict.vllm_wrong
    record_e2e(
        r.model.name,
        "whose fault: plain vLLM (no speculators) vs transformers, prompt logprobs",
        "pass" if holds else "fail",  # the row says whether the attribution held, as the test does
        says,
        max_abs_diff=verdict.max_abs_diff,
    )
    assert holds, says


def speculators_cause(r, name: str) -> str:
    """Why speculators' path gives no right states for this model, as observed in this run."""
    from harness import contracts

    if r.refused:
        return f"the generator refuses speculators' states: {r.refused}"
    if r.failed is not None:
        root = contracts.start_root(r.failed.text, r.model)
        cause = f"{root[0]}[{name}]: {root[1].error}" if root else r.failed.text
        return f"speculators' generator does not start: {cause}"
    return f"C-forward says speculators' states are not the model's (forward[{name}])"


def test_streamed_and_shared_memory_hand_offs_are_bit_identical_to_the_rpc(run, record_e2e):
    """The captured states leave the worker step by step into /dev/shm, each row at its final place
    (harness.runtime.transport.Stream), or after the last step through /dev/shm (`shm`), instead of in the RPC
    reply; the caller copies them out on more than one thread into reused memory. On a batch over one step's
    token budget (rows regrouped per request), all three must give the same bits as speculators' own path (RPC
    reply, one thread, fresh pages) on the same prompts, and each path must be the one taken. Whether the rows
    had to move depends on the runner's slot order and is recorded (tiny Llama's do on 0.16)."""
    from harness.contracts import chunkedprefill
    from harness.runtime import transport

    gen = run.generator
    shipped = gen.copy_out
    budget = int(gen.vllm_config.scheduler_config.max_num_batched_tokens)
    batch = batches.straddling_batch(budget, run.model.vocab_size)
    set_transport = lambda mode: gen.real_executor.collective_rpc("_harness_set_transport", args=(mode,))[0]  # noqa: E731
    regrouped = lambda: gen.real_executor.collective_rpc(chunkedprefill.reordered)[0]  # noqa: E731
    out, used = {}, {}
    try:
        start, moved = set_transport("stream"), regrouped()
        gen.copy_out = transport.CopyOut(threads=2)
        out["stream"] = gen.generate(batch)
        after = set_transport("shm")
        used["stream"], moved = after["streamed"] - start["streamed"], regrouped() - moved
        out["shm"] = gen.generate(batch)
        end = set_transport("rpc")
        used["shm"] = (end["shm"] - after["shm"]) - (end["streamed"] - after["streamed"])
        gen.copy_out = transport.CopyOut(enabled=False)
        out["rpc"] = gen.generate(batch)
    finally:
        gen.copy_out = shipped
        set_transport("stream")

    def same(a, b):
        return all(
            torch.equal(x, y)
            for r1, r2 in zip(a, b, strict=True)
            for x, y in zip(r1["hidden_states"], r2["hidden_states"], strict=True)
        )

    equal = {mode: same(out[mode], out["rpc"]) for mode in ("stream", "shm")}
    ok = all(equal.values()) and used["stream"] == 1 and used["shm"] == 1
    record_e2e(
        run.model.name,
        "streamed and shared-memory hand-offs == RPC reply, bitwise",
        "pass" if ok else "fail",
        f"{len(batch)} prompts, {sum(map(len, batch))} tokens over a {budget}-token step, x "
        f"{len(gen.layer_ids)} layers; batches streamed {used['stream']} (rows regrouped {moved}), "
        f"shared memory after the last step {used['shm']}; bitwise equal: "
        + ", ".join(f"{mode} {'yes' if same_ else 'no'}" for mode, same_ in equal.items()),
    )
    assert used["stream"] == 1, "the streamed hand-off was not taken (no room in /dev/shm, or a step not placed?)"
    assert used["shm"] == 1, "the end-of-batch shared-memory hand-off was not taken"
    assert equal == {"stream": True, "shm": True}
