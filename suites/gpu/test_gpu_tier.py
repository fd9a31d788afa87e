"""The GPU tier: speculators 0.3.0's generator through the shims, at tensor_parallel_size=TP on CUDA.

Exact for the real Kimi-K2.5 (give its local path; TP defaults to 8) and proven on tiny-Kimi. Checks:
one tensor per requested layer of shape [tokens, hidden_size from the checkpoint]; the requested
dtype; all finite; each prompt's states equal a run of that prompt alone (tolerance by dtype,
harness.gpu.tier.bound); the same batch twice bitwise equal (or the difference measured and
bounded); capture on TP rank 0 only; where the decoder stack lives (C-kimistack); fewer GPUs than
TP is a clear error; and no process is left once the generator is closed. Tests run in file order.
"""

from __future__ import annotations

import time

import pytest
import torch

from harness.gpu.tier import ALONE_CHECK, bound, fingerprint

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _check(tier, name: str, ok: bool, measured: str) -> None:
    tier.facts.setdefault("checks", []).append(
        {"check": name, "result": "pass" if ok else "fail", "measured": measured}
    )


def test_batch_shapes_dtype_finite(tier):
    gen, prompts = tier.generator, tier.prompts
    t0 = time.perf_counter()
    first = gen.generate(prompts)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = gen.generate(prompts)
    steady_s = time.perf_counter() - t0
    tokens = sum(map(len, prompts))
    tier.facts["throughput"] = {
        "tokens": tokens,
        "seconds": steady_s,
        "tokens_per_s": tokens / steady_s,
        "first_call_s": first_s,
        "prompts": len(prompts),
    }
    tier.batch, tier.first_batch = results, first
    want = DTYPES[tier.cfg.dtype]
    bad = []
    for p, r in zip(prompts, results, strict=True):
        if len(r["hidden_states"]) != len(gen.layer_ids):
            bad.append(f"{len(r['hidden_states'])} tensors for {len(gen.layer_ids)} layers")
        for h in r["hidden_states"]:
            if tuple(h.shape) != (len(p), tier.hidden_size):
                bad.append(f"shape {tuple(h.shape)} != ({len(p)}, {tier.hidden_size})")
            if h.dtype != want:
                bad.append(f"dtype {h.dtype} != {want}")
            if not torch.isfinite(h).all():
                bad.append("non-finite values")
    tier.facts["fingerprint"] = fingerprint(results, gen.layer_ids)
    _check(
        tier,
        "one tensor per layer, [tokens, hidden], dtype, finite",
        not bad,
        f"{len(prompts)} prompts, {tokens} tokens, hidden {tier.hidden_size}, {tier.cfg.dtype}; {bad[:3] or 'ok'}",
    )
    assert not bad, bad[:5]


def _pairs(a: list, b: list) -> list:
    """Tensor pairs of two results of the same prompts; never empty (a comparison of nothing cannot pass)."""
    pairs = [
        (x, y)
        for r1, r2 in zip(a, b, strict=True)
        for x, y in zip(r1["hidden_states"], r2["hidden_states"], strict=True)
    ]
    assert pairs and len(a) == len(b), f"nothing to compare: {len(a)} vs {len(b)} results"
    return pairs


def test_prompt_alone_equals_prompt_in_batch(tier):
    batch = tier.reference_batch()
    assert len(batch) == len(tier.prompts) > 0
    layers = tier.generator.layer_ids
    by_layer = [0.0] * len(layers)  # where along the stack a prompt's states first leave the bound
    over = 0
    tol = bound(tier.cfg.dtype, [h for r in batch for h in r["hidden_states"]])
    for i, p in enumerate(tier.prompts):
        alone = tier.generator.generate([p])[0]["hidden_states"]
        diffs = [
            float((x.float() - y.float()).abs().max()) for x, y in zip(alone, batch[i]["hidden_states"], strict=True)
        ]
        by_layer = [max(a, b) for a, b in zip(by_layer, diffs, strict=True)]
        over += max(diffs) > tol
    worst = max(by_layer)
    tier.facts["alone_vs_batch_by_layer"] = dict(zip(map(str, layers), by_layer, strict=True))
    _check(
        tier,
        ALONE_CHECK,
        worst <= tol,
        f"max abs diff {worst:.3g} (tolerance {tol:.3g}); {over} of {len(tier.prompts)} prompts over it; by "
        "captured layer: " + ", ".join(f"{lid}: {d:.3g}" for lid, d in zip(layers, by_layer, strict=True)),
    )
    assert worst <= tol


def test_same_batch_twice(tier):
    batch = tier.reference_batch()
    again = tier.generator.generate(tier.prompts)
    pairs = _pairs(batch, again)
    bitwise = all(torch.equal(a, b) for a, b in pairs)
    diff = 0.0 if bitwise else max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    tol = bound(tier.cfg.dtype, [a for a, _ in pairs])
    first_equal = all(torch.equal(a, b) for a, b in _pairs(tier.first_batch, batch))
    measured = "bitwise equal" if bitwise else f"not bitwise: max abs diff {diff:.3g} (bound {tol:.3g})"
    if not bitwise:  # name the module that broke it (harness.gpu.module_determinism)
        from harness.gpu import module_determinism

        found = module_determinism.diagnose(tier.generator, tier.prompts)
        tier.facts["nondeterministic_module"] = found
        culprit = found.get("culprit")
        measured += (
            f"; first module with equal inputs and different outputs: {culprit['module']} "
            f"({culprit['class']}, max abs diff {culprit['max_abs_diff']})"
            if culprit
            else f"; no recorded module call differs on equal inputs ({found['differing']} of "
            f"{found['calls']} calls differ)"
        )
    _check(tier, "same batch twice", bitwise or diff <= tol, measured)
    tier.facts["first_call_bitwise_equal_to_second"] = first_equal
    tier.facts["same_batch_bitwise"] = bitwise
    assert bitwise or diff <= tol


def test_fast_path_equals_speculators_loop(tier):
    """`generate(..., fast=True)` (harness.runtime.fast_path: the next step scheduled while the forward runs, results
    as views of the hand-off buffer) against speculators' own loop, on a batch over one step's token budget: bitwise
    (where the same batch twice is bitwise; else within the tier's bound, said so)."""
    from harness.subjects import batches

    gen = tier.generator
    budget = int(gen.vllm_config.scheduler_config.max_num_batched_tokens)
    big = batches.straddling_batch(budget, gen.vocab_size)
    theirs = gen.generate(big)
    ahead = gen.steps_ahead
    ours = gen.generate(big, fast=True)
    ahead = gen.steps_ahead - ahead
    pairs = _pairs(ours, theirs)
    bitwise = all(torch.equal(a, b) for a, b in pairs)
    diff = 0.0 if bitwise else max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    tol = bound(tier.cfg.dtype, [b for _, b in pairs])
    deterministic = tier.facts.get("same_batch_bitwise", True)
    ok = ahead >= 1 and (bitwise or (not deterministic and diff <= tol))
    _check(
        tier,
        "fast path == speculators' loop",
        ok,
        f"{len(big)} prompts over a {budget}-token step, {ahead} step(s) scheduled during a forward; "
        + ("bitwise equal" if bitwise else f"not bitwise: max abs diff {diff:.3g} (bound {tol:.3g})"),
    )
    assert ahead >= 1, "no step was scheduled while the previous one ran"
    assert bitwise or (not deterministic and diff <= tol)


def test_states_on_device_equal_host(tier):
    """`Options(states_on="device")` (harness.runtime.device_hand_off: each step's rows streamed into a buffer on the
    worker's GPU, opened here through CUDA IPC) on a batch over one step's token budget: both calls go through the
    device hand-off (counted) and give the host hand-off's results; the fast path's are tensors on the GPU
    (speculators' own loop copies each prompt's rows to the host itself, `.clone().cpu()`, so its stay there)."""
    from harness.subjects import batches

    gen = tier.generator
    budget = int(gen.vllm_config.scheduler_config.max_num_batched_tokens)
    big = batches.straddling_batch(budget, gen.vocab_size)
    host = gen.generate(big)

    def switch(mode: str) -> dict:
        return gen.real_executor.collective_rpc("_harness_set_transport", args=(mode,))[0]

    before = switch("device")
    try:
        outs = {"speculators' loop": gen.generate(big), "fast path": gen.generate(big, fast=True)}
        used = switch("stream")["device"] - before["device"]
    finally:
        switch("stream")
    on_gpu = all(t.is_cuda for r in outs["fast path"] for t in r["hidden_states"])
    deterministic = tier.facts.get("same_batch_bitwise", True)
    found, ok = [], used == len(outs) and on_gpu
    for name, out in outs.items():
        pairs = [(a, b.cpu()) for a, b in _pairs(host, out)]
        bitwise = all(torch.equal(a, b) for a, b in pairs)
        diff = 0.0 if bitwise else max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
        ok = ok and (bitwise or (not deterministic and diff <= bound(tier.cfg.dtype, [a for a, _ in pairs])))
        found.append(f"{name} " + ("bitwise equal" if bitwise else f"max abs diff {diff:.3g}"))
    _check(
        tier,
        "states on the device == host hand-off",
        ok,
        f"{len(big)} prompts over a {budget}-token step; {used} of {len(outs)} calls through the device hand-off, "
        f"fast path's results on the GPU: {'yes' if on_gpu else 'no'}; " + "; ".join(found),
    )
    assert used == len(outs) and on_gpu
    assert ok


def test_capture_on_tp_rank0_only(tier):
    counts = tier.generator.real_executor.collective_rpc("_harness_capture_count")
    ok = counts[0] > 0 and all(c == 0 for c in counts[1:])
    _check(tier, "states captured on TP rank 0 only", ok, f"captures per rank {counts}")
    assert ok, counts


def test_model_contracts(tier, record_observation, expectations):
    """C-kimistack (where the decoder stack lives) and the other per-model contracts, on the loaded model (C-forward:
    speculators' loop against the model's own forward on this GPU's kernels).

    Held to the expectations for this vLLM and platform where they name this model family."""
    from harness.contracts import eagle3, embed, forward, kimistack, layer
    from harness.testing.probe_context import ProbeContext

    ctx = ProbeContext(tier.model, tier.generator)
    observations = [module.probe(ctx) for module in (kimistack, eagle3, embed, layer, forward)] + [tier.mla]
    wrong = []
    for obs in observations:
        record_observation(obs, hold=False)  # every row reaches the GPU report first; held below
        exp = expectations["table"].get(obs.key)
        if exp is not None and exp.outcome != obs.outcome:
            wrong.append(f"{obs.key}: expected {exp.outcome} ({exp.reason}), observed {obs.outcome}: {obs.reason}")
    tier.facts["contracts"] = {
        o.key: {
            "outcome": str(o.outcome),
            "reason": o.reason,
            "expected": str(expectations["table"][o.key].outcome) if o.key in expectations["table"] else None,
        }
        for o in observations
    }
    _check(
        tier,
        "per-model contracts match expectations",
        not wrong,
        "; ".join(f"{o.key}: {o.outcome}" for o in observations),
    )
    assert not wrong, wrong


def test_fewer_gpus_than_tp_is_a_clear_error(tier):
    from harness.runtime.generator import HarnessGenerator, HarnessInputError

    if tier.cfg.allow_cpu:
        pytest.skip("dry run on CPU: there are no GPUs to count")
    have = torch.cuda.device_count()
    with pytest.raises(HarnessInputError, match=f"tensor_parallel_size={have + 1} needs {have + 1} GPUs"):
        HarnessGenerator(tier.cfg.model_path, tensor_parallel_size=have + 1)


def _plain_engine(tier):
    """Plain vLLM on the tier's checkpoint as the tier's generator runs it (TP, dtype, length, memory share,
    attention backend, text model only for a multimodal checkpoint), with speculators' scheduler limits."""
    from harness.scenarios import bench

    cfg = tier.cfg
    return bench.plain_engine(
        cfg.model_path,
        cfg.dtype,
        cfg.max_model_len,
        tensor_parallel_size=cfg.tp,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        attention_backend=cfg.attention_backend,
        language_model_only=tier.language_model_only,
    )


#: The soak's calls on the GPU (harness.scenarios.soak): the sequence that killed the worker on the H200 before the hand-off
#: buffer was unpinned on growth (4x64, 16x1500, 4x64, 32x2000), then random calls to 52 in all.
SOAK_OPENING = ((4, 64), (16, 1500), (4, 64), (32, 2000))
SOAK_CALLS, SOAK_SEED = 52, 2026


def test_soak_one_generator_calls_of_every_size(tier):
    """One generator, calls that grow, shrink, straddle step budgets and repeat, a prompt of max_model_len - 1
    tokens, a call after a refused one: every call rows = tokens, each prompt's rows its own (mean difference from
    itself extracted alone within the tier's bound; the maximum, the kernels' batch variance, reported: see
    harness.scenarios.soak), no worker replaced, host and device memory flat after warm-up (peaks in the report)."""
    from harness.scenarios import soak

    gen = tier.generator
    budget = int(gen.vllm_config.scheduler_config.max_num_batched_tokens)
    opening = tuple((n, min(length, gen.max_model_len - 1)) for n, length in SOAK_OPENING)
    plan = soak.plan(SOAK_SEED, SOAK_CALLS, gen.vocab_size, gen.max_model_len, budget, max_prompts=32, opening=opening)
    result = soak.run(gen, plan, lambda tensors: bound(tier.cfg.dtype, tensors), strict=False)
    rep = result.to_json()
    tier.facts["soak"] = rep
    _check(
        tier,
        "soak: one generator survives calls of every size",
        result.ok,
        f"{rep['calls']} calls (seed {SOAK_SEED}), tokens {min(rep['tokens_per_call'])}-{max(rep['tokens_per_call'])}, "
        f"diff from itself alone: mean {rep['mean_diff_alone']:.3g}, max {rep['max_diff_alone']:.3g} (bound "
        f"{rep['bound']:.3g}; {rep['calls_over_bound_max']} calls over it at the max); host peak "
        f"{rep['host_peak_warmup'] >> 20}/{rep['host_peak_after'] >> 20} MiB (warm-up/after), device held by tensors "
        f"{[b >> 20 for b in rep['device_peak_warmup']]}/{[b >> 20 for b in rep['device_peak_after']]} MiB, "
        f"reserved by the allocator {[b >> 20 for b in rep.get('device_reserved_peak_warmup', [])]}/"
        f"{[b >> 20 for b in rep.get('device_reserved_peak_after', [])]} MiB; "
        f"failures: {rep['failures'] or 'none'}",
    )
    assert not result.failures, result.failures
    assert result.workers_before == result.workers_after, "a worker was replaced"
    assert rep["host_flat"] and rep["device_flat"], rep


def test_throughput_against_plain_prefill(tier):
    """Extraction against plain vLLM prefill (`LLM.generate(max_tokens=1)`) on the tier's checkpoint and prompts, with
    the model FLOP utilisation of each (harness.gpu.flops): the figures the GPU benchmark gives at the generated
    shapes, for the real checkpoint of the nightly. Where both engines fit (memory share <= 0.45 each) they are
    timed in interleaved pairs (harness.scenarios.bench.paired); else (Kimi-K2.5 at TP=8) one after the other: ours, then
    the tier's generator is closed and plain vLLM started in its place (`mode` says which; a ratio of medians
    then). Recorded, never asserted: the test fails only if a side cannot be measured."""
    from harness.gpu import flops
    from harness.scenarios import bench

    cfg = tier.cfg
    if cfg.throughput_pairs < 1:
        pytest.skip("throughput not asked for (--throughput-pairs 0)")
    if cfg.allow_cpu:
        pytest.skip("dry run on CPU: no throughput on a CPU build")
    gen, prompts = tier.generator, tier.prompts
    lengths = [len(p) for p in prompts]
    fm = flops.checkpoint_flop_model(cfg.model_path)
    per_call = flops.call_flops(fm, lengths)
    pairs = cfg.throughput_pairs
    ours = lambda: gen.generate(prompts)  # noqa: E731
    llm = None
    try:
        if cfg.gpu_memory_utilization <= 0.45:
            mode = "paired (both engines alive, interleaved)"
            llm = _plain_engine(tier)
            r = bench.paired(bench.prefill_call(llm, prompts), ours, pairs=pairs)
        else:
            mode = "sequential (two engines do not fit: ours timed, closed, then plain vLLM in its place)"
            extract = bench.timed(ours, pairs)
            tier.close()
            llm = _plain_engine(tier)
            r = bench.unpaired(bench.timed(bench.prefill_call(llm, prompts), pairs), extract)
    finally:
        if llm is not None:
            bench.shutdown(llm)
    tokens = sum(lengths)
    out = {
        "mode": mode,
        "pairs": pairs,
        "tokens": tokens,
        "prompts": len(prompts),
        "flop_model": fm,
        "flops_per_call": per_call,
        "peak_flops": flops.PEAK_FLOPS,
        "plain_tokens_per_s": tokens / r["plain_s"]["median"],
        "extract_tokens_per_s": tokens / r["extract_s"]["median"],
        "plain_mfu": flops.mfu(per_call, r["plain_s"]["median"]) / cfg.tp,
        "extract_mfu": flops.mfu(per_call, r["extract_s"]["median"]) / cfg.tp,
        "ratio": r["ratio"],
        "plain_s": r["plain_s"],
        "extract_s": r["extract_s"],
        "verdict": bench.verdict(r["ratio"]),
    }
    tier.facts["throughput_vs_prefill"] = out
    measured = all(v > 0 for v in r["plain_s"]["all"] + r["extract_s"]["all"])
    _check(
        tier,
        "extraction vs plain prefill measured (speed recorded, not asserted)",
        measured,
        f"{out['verdict']}; {mode}; plain {out['plain_tokens_per_s']:.0f} tok/s (MFU {out['plain_mfu']:.1%} a GPU), "
        f"extraction {out['extract_tokens_per_s']:.0f} tok/s (MFU {out['extract_mfu']:.1%} a GPU)",
    )
    assert measured


def test_zz_shutdown_leaves_no_process(tier):
    import psutil

    from harness.gpu.tier import gpu_processes

    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    tier.close()
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in ours if psutil.pid_exists(p)], timeout=30)
    alive = [
        p.pid
        for p in alive
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())
    ]
    on_gpu = sorted(set(gpu_processes()) & ours)
    _check(
        tier,
        "no worker process left after close",
        not alive and not on_gpu,
        f"alive children {alive}; children still on a GPU {on_gpu}",
    )
    assert not alive and not on_gpu
