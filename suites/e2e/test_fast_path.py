"""The fast path (`generate(..., fast=True)`, harness.runtime.fast_path) gives bitwise the hidden states of
speculators' own loop, on the session's generator of each tiny model: a batch over one step's token budget (a
prompt straddles two steps; the next step is scheduled while the first runs), then a smaller batch of unequal
prompts. The fast results are views of the hand-off buffer; ones still held when the next call starts are moved
out first, so a result never changes under its holder (checked across two later calls, one of each path)."""

from __future__ import annotations

import torch

from harness.contracts.twophase import CONTRACT as TWOPHASE_CONTRACT
from harness.subjects import batches
from harness.subjects.prompts import random_prompts

TWOPHASE = TWOPHASE_CONTRACT.id


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(r1["input_ids"], r2["input_ids"])
        and len(r1["hidden_states"]) == len(r2["hidden_states"])
        and all(torch.equal(x, y) for x, y in zip(r1["hidden_states"], r2["hidden_states"], strict=True))
        for r1, r2 in zip(a, b, strict=True)
    )


def test_fast_path_is_bitwise_speculators_loop(run, record_e2e):
    gen = run.generator
    budget = int(gen.vllm_config.scheduler_config.max_num_batched_tokens)
    big = batches.straddling_batch(budget, run.model.vocab_size)
    small = random_prompts(5, 17, 131, run.model.vocab_size, seed=41)
    ahead_before, detached_before = gen.steps_ahead, gen.fast_views.detached
    view = gen.executor_view

    theirs_big = gen.generate(big)
    follow_ups, behind = view.engaged.get(TWOPHASE, 0), view.sent_behind
    ours_big = gen.generate(big, fast=True)
    ahead = gen.steps_ahead - ahead_before
    follow_ups, behind = view.engaged.get(TWOPHASE, 0) - follow_ups, view.sent_behind - behind
    views = all(h._base is not None for r in ours_big for h in r["hidden_states"])
    equal_big = same(ours_big, theirs_big)
    ours_small = gen.generate(small, fast=True)  # ours_big is still held: moved out before this call writes
    theirs_small = gen.generate(small)  # and ours_small before this one
    equal_small = same(ours_small, theirs_small)
    kept = same(ours_big, theirs_big) and same(ours_small, theirs_small)
    detached = gen.fast_views.detached - detached_before

    ok = equal_big and equal_small and kept and views and ahead >= 1 and behind == follow_ups
    record_e2e(
        run.model.name,
        "fast path == speculators' loop, bitwise",
        "pass" if ok else "fail",
        f"{len(big)} prompts / {sum(map(len, big))} tokens over a {budget}-token step ({ahead} step(s) scheduled "
        f"while the previous ran; {behind} of {follow_ups} C-twophase follow-up(s) sent without waiting), then "
        f"{len(small)} prompts; bitwise equal: {'yes' if equal_big else 'no'}, "
        f"{'yes' if equal_small else 'no'}; results were views: {'yes' if views else 'no'}; "
        f"{detached} held views moved out before reuse, unchanged: {'yes' if kept else 'no'}",
    )
    assert views, "the fast path copied its results instead of handing out views of the hand-off buffer"
    assert ahead >= 1, "no step was scheduled while the previous one ran: the batch did not straddle steps"
    assert behind == follow_ups, (
        "a C-twophase follow-up on the fast path was waited for instead of sent behind its step"
    )
    assert equal_big and equal_small, "the fast path's hidden states differ from speculators' loop"
    assert detached >= len(big) * len(gen.layer_ids), "held results were not moved out before the buffer was reused"
    assert kept, "a held fast result changed when a later call reused the hand-off buffer"
