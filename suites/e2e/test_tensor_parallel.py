"""speculators' generator at tensor_parallel_size=2 on vLLM's CPU build (harness.runtime.cpu_ranks binds each rank's
threads and sizes its swap space): its states equal transformers' within the bound the TP=1 run is held to, and the
fast path gives bitwise speculators' loop. What TP=2 adds over TP=1 is real: two worker processes, the weights
sharded, the all-reduce between them (gloo), the RPC answered by one rank, the states captured on rank 0 and handed
back; the tiny models' heads, KV heads and experts divide by 2.

A second row per model holds what only exists across ranks (harness.testing.ranks): the reply speculators asks of
rank 0 comes from rank 0; rank 0 stores the captured states and no other rank stores any or makes a hand-off
buffer; every rank applies the same shims; a short soak (calls that grow, shrink, straddle the step budget, repeat)
keeps its workers; nothing is left in /dev/shm once the generator is shut down.

float32 as the TP=1 run (vLLM's CPU build would downcast a float32 checkpoint to bfloat16, where two ranks' reduction
order alone moves the states by more than any float32 bound)."""

from __future__ import annotations

import pytest
import torch

from harness.runtime.generator import options_for, patched_generator
from harness.subjects import reference
from harness.subjects.prompts import random_prompts
from harness.testing.leaks import shm_entries, shm_left
from harness.testing.probe_context import MAX_MODEL_LEN
from harness.testing.recording import not_applicable, not_applicable_if_declared_broken

#: The suite's TP rows run these models at `--harness-tp` ranks (default 2); `harness run --tp 8` runs the model
#: sized for 8 (`--harness-tp-models`).
MODELS = ("tiny-llama", "tiny-kimi-k25")


def pytest_generate_tests(metafunc):
    if "name" in metafunc.fixturenames and "tp" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--harness-tp-models")
        metafunc.parametrize("name", chosen.split(",") if chosen else MODELS)


@pytest.fixture
def tp(request) -> int:
    return int(request.config.getoption("--harness-tp"))


#: The soak at TP=N: fewer calls than the TP=1 soak's (two ranks on two cores), the same kinds of call.
SOAK_SEED, SOAK_CALLS = 29, 8


def test_tp_states_equal_transformers_and_the_fast_path_equals_the_loop(name, tp, runs, record_e2e, expectations):
    run = runs(name)  # the TP=1 run says whether this model runs on this vLLM at all (and sets up MLA as it does)
    check = f"TP={tp}: vs transformers hidden_states[k+1], float64; fast path == loop, bitwise"
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
    shm_before = shm_entries()
    with patched_generator(
        model.path,
        list(model.probe_layers),
        tensor_parallel_size=tp,
        max_model_len=MAX_MODEL_LEN,
        options=options_for(model, dtype="float32"),
    ) as gen:
        loop = gen.generate(batch)
        fast = gen.generate(batch, fast=True)
        layer_ids = gen.layer_ids
        across = across_ranks(gen, tp)
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
    assert c.held, f"TP={tp} states vs transformers: {c.said()}"
    assert bitwise, f"TP={tp}: the fast path's states are not bitwise speculators' loop's"
    held, said = across
    left = shm_left(shm_before)
    held = held and not left
    said += f"; /dev/shm left after shutdown: {sorted(left) or 'none'}"
    record_e2e(
        name,
        f"TP={tp}: rank 0 replies and captures, no hand-off elsewhere, same shims, soak calls",
        "pass" if held else "fail",
        said,
    )
    assert held, said


def across_ranks(gen, tp: int) -> tuple[bool, str]:
    """The multi-rank checks on a running TP=N generator (harness.testing.ranks), after a short soak: calls that
    grow, shrink, straddle the step budget and repeat, each held to the prompt-alone bound, no worker replaced."""
    from harness.scenarios import soak
    from harness.testing import ranks

    budget = int(gen.vllm_config.scheduler_config.max_num_batched_tokens)
    plan = soak.plan(SOAK_SEED, SOAK_CALLS, gen.vocab_size, gen.max_model_len, budget, max_prompts=12)
    result = soak.run(gen, plan, reference.tolerance)
    call = gen.real_executor.collective_rpc
    replied = call("_harness_call", args=(ranks.tp_rank,), unique_reply_rank=0)
    replied = replied[0] if isinstance(replied, list) else replied  # C-rpc: a list of one before 0.11.1
    held, said = ranks.judged(call("_harness_call", args=(ranks.rank_facts,)), int(replied), tp)
    rep = result.to_json()
    said += (
        f"; soak {rep['calls']} calls (seed {SOAK_SEED}), tokens {min(rep['tokens_per_call'])}-"
        f"{max(rep['tokens_per_call'])}, workers replaced: {rep['workers_restarted']}, "
        f"failures: {rep['failures'] or 'none'}"
    )
    said += f"; ranks' resident memory after the soak: {ranks.resident_gib(gen):.1f} GiB"
    return held and result.ok, said
