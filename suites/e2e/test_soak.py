"""The soak scenario on a CPU build (harness.scenarios.soak): the session's tiny-Llama generator, calls that grow, shrink,
straddle the step budget and repeat, a prompt of exactly max_model_len - 1 tokens and a call after a refused one.
Shorter than the GPU tier's (which runs it at 50+ calls on the H200, where pinned buffers make growth matter);
the logic it checks here is the platform-independent part: buffer growth and reuse, the row regrouping across
steps, no worker replaced, host memory flat after warm-up.
"""

from __future__ import annotations

import pytest

from harness.scenarios import soak
from harness.subjects import reference

MODEL = "tiny-llama"
SEED = 28


def test_one_generator_survives_calls_of_every_size(runs, record_e2e):
    run = runs(MODEL)
    if run.generator is None:
        pytest.fail(f"the shimmed generator did not start on {MODEL}: {run.failed.text}")
    gen = run.generator
    budget = int(gen.vllm_config.scheduler_config.max_num_batched_tokens)
    plan = soak.plan(
        SEED,
        20,
        gen.vocab_size,
        gen.max_model_len,
        budget,
        max_prompts=24,
        opening=((4, 64), (16, 300), (4, 64), (24, 400)),
    )
    assert sum(sum(map(len, c)) > budget for c in plan.calls) >= 3, "fewer than 3 calls straddle the step budget"
    assert any(len(p) == gen.max_model_len - 1 for c in plan.calls for p in c)
    result = soak.run(gen, plan, reference.tolerance)  # a prompt alone vs inside a batch, as in test_extraction
    rep = result.to_json()
    record_e2e(
        MODEL,
        "soak: one generator, calls that grow, shrink, straddle steps, repeat",
        "pass" if result.ok else "fail",
        f"{rep['calls']} calls (seed {SEED}), tokens {min(rep['tokens_per_call'])}-{max(rep['tokens_per_call'])}; "
        f"max diff alone {rep['max_diff_alone']:.2e}; host peak {rep['host_peak_warmup'] >> 20} MiB at warm-up, "
        f"{rep['host_peak_after'] >> 20} MiB after; refused: {rep['refused']}; failures: {rep['failures'] or 'none'}",
        soak=rep,
    )
    assert not result.failures, result.failures
    assert result.refused and "outside the vocabulary" in result.refused
    assert result.workers_before == result.workers_after, "a worker was replaced"
    assert rep["host_flat"], f"host memory grew after warm-up: {rep['host_peak_warmup']} -> {rep['host_peak_after']}"
