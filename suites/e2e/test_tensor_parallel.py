"""speculators' generator at tensor_parallel_size=2 on vLLM's CPU build (harness.runtime.cpu_ranks binds each rank's
threads and sizes its swap space): its states equal transformers' within the bound the TP=1 run is held to, and the
fast path gives bitwise speculators' loop. What TP=2 adds over TP=1 is real: two worker processes, the weights
sharded, the all-reduce between them (gloo), the RPC answered by one rank, the states captured on rank 0 and handed
back; the tiny models' heads, KV heads and experts divide by 2.

float32 as the TP=1 run (vLLM's CPU build would downcast a float32 checkpoint to bfloat16, where two ranks' reduction
order alone moves the states by more than any float32 bound)."""

from __future__ import annotations

import pytest
import torch

from harness.runtime.generator import options_for, patched_generator
from harness.subjects import reference
from harness.subjects.prompts import random_prompts
from harness.testing.probe_context import MAX_MODEL_LEN
from harness.testing.recording import not_applicable, not_applicable_if_declared_broken

TP = 2
MODELS = ("tiny-llama", "tiny-kimi-k25")


@pytest.mark.parametrize("name", MODELS)
def test_tp2_states_equal_transformers_and_the_fast_path_equals_the_loop(name, runs, record_e2e, expectations):
    run = runs(name)  # the TP=1 run says whether this model runs on this vLLM at all (and sets up MLA as it does)
    check = f"TP={TP}: vs transformers hidden_states[k+1], float64; fast path == loop, bitwise"
    if run.absent:
        record_e2e(name, check, "n/a", run.absent)
        not_applicable(run.absent)
    if run.generator is None or run.refused:
        why = run.refused or run.failed.text
        record_e2e(name, check, "fail", f"TP=1 gives no states to compare with: {why}")
        not_applicable_if_declared_broken(expectations, name, why)
        pytest.fail(f"{name} gives no states at TP=1: {why}")
    model = run.model
    batch = random_prompts(6, 17, 131, model.vocab_size, seed=1)
    with patched_generator(
        model.path,
        list(model.probe_layers),
        tensor_parallel_size=TP,
        max_model_len=MAX_MODEL_LEN,
        options=options_for(model, dtype="float32"),
    ) as gen:
        loop = gen.generate(batch)
        fast = gen.generate(batch, fast=True)
        layer_ids = gen.layer_ids
    c = reference.against([r["hidden_states"] for r in loop], model.path, batch, layer_ids)
    bitwise = all(
        torch.equal(x, y)
        for a, b in zip(loop, fast, strict=True)
        for x, y in zip(a["hidden_states"], b["hidden_states"], strict=True)
    )
    ok = c.held and bitwise
    record_e2e(
        name,
        check,
        "pass" if ok else "fail",
        f"{c.said()}; fast == loop bitwise: {bitwise}; layers {layer_ids}",
        max_abs_diff=c.diff,
    )
    assert c.held, f"TP={TP} states vs transformers: {c.said()}"
    assert bitwise, f"TP={TP}: the fast path's states are not bitwise speculators' loop's"
