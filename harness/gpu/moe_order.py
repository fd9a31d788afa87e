"""Marlin MoE's token order: one canonical layout, and the GPU proof that it makes INT4 MoE extraction repeatable.

vLLM's Marlin MoE path (the kernel it picks for Kimi-K2.5's INT4 experts) groups each expert's tokens with
`moe_align_block_size`, which places them with atomics: the same routing gives different (equally legal) layouts
from call to call, and Marlin's output depends on where a token sits (vllm-project/vllm#52525, open). The GPU tier
found the consequence on the Kimi-K2.5 INT4 slice: the same batch twice is not bitwise equal, and the first module
whose output changes on equal inputs is the routed experts' runner (harness.gpu.module_determinism).

`canonical_order` sorts each expert's run of token slots (padding, the largest id, stays last): one layout for one
routing. `engage(worker)` wraps the aligner Marlin's MoE module calls with it, in that worker.

    python -m harness.gpu.moe_order --model-path DIR --out r.json [--tp 1] [--gpu-memory-utilization 0.45]

starts the shimmed generator once on DIR and records, on the tier's prompts: the same batch twice without and then
with the canonical order (bitwise? max abs diff; the module the diagnosis blames), each prompt alone against the
batch, and the fast path against speculators' loop, with the order engaged. An experiment on the way to a contract:
it says whether the layout is the whole cause.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

#: Where vLLM's Marlin MoE experts look the aligner up (a module global; vLLM 0.25).
MARLIN_MODULE = "vllm.model_executor.layers.fused_moe.experts.marlin_moe"
ALIGNER = "moe_align_block_size"


def canonical_order(sorted_ids, expert_ids, block_size: int):
    """`sorted_ids` (int32 token-slot ids, `block_size` a block, block b belonging to `expert_ids[b]`) with each run of
    consecutive blocks of one expert sorted ascending, in place; returned. Slots past the blocks are left alone."""
    import torch

    blocks = min(int(expert_ids.numel()), int(sorted_ids.numel()) // block_size)
    if blocks == 0:
        return sorted_ids
    used = sorted_ids[: blocks * block_size].view(blocks, block_size)
    experts = expert_ids[:blocks]
    starts = torch.ones(blocks, dtype=torch.bool, device=experts.device)
    starts[1:] = experts[1:] != experts[:-1]
    run = torch.cumsum(starts.to(torch.int64), 0).view(-1, 1)
    key = (run << 32) | (used.to(torch.int64) & 0xFFFFFFFF)
    ordered = torch.sort(key.view(-1)).values & 0xFFFFFFFF
    used.copy_(ordered.to(torch.int32).view(blocks, block_size))  # int32 round trip restores negative ids
    return sorted_ids


def engage(worker) -> bool:
    """(Runs on a worker.) Wrap Marlin MoE's aligner with `canonical_order`; False where vLLM has no such module."""
    import importlib

    try:
        module = importlib.import_module(MARLIN_MODULE)
    except ImportError:
        return False
    inner = getattr(module, ALIGNER, None)
    if inner is None or getattr(inner, "_harness_canonical", False):
        return inner is not None

    def aligned(topk_ids, block_size, *args, **kwargs):
        sorted_ids, expert_ids, padded = inner(topk_ids, block_size, *args, **kwargs)
        return canonical_order(sorted_ids, expert_ids, block_size), expert_ids, padded

    aligned._harness_canonical = True
    aligned._harness_inner = inner
    setattr(module, ALIGNER, aligned)
    return True


def disengage(worker) -> bool:
    """(Runs on a worker.) Put vLLM's own aligner back."""
    import importlib

    module = importlib.import_module(MARLIN_MODULE)
    current = getattr(module, ALIGNER)
    if getattr(current, "_harness_canonical", False):
        setattr(module, ALIGNER, current._harness_inner)
        return True
    return False


def _compare(first, second) -> dict:
    import torch

    pairs = [(a, b) for r1, r2 in zip(first, second) for a, b in zip(r1["hidden_states"], r2["hidden_states"])]
    bitwise = all(torch.equal(a, b) for a, b in pairs)
    diff = 0.0 if bitwise else max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    return {"bitwise": bitwise, "max_abs_diff": diff}


def experiment(model_path: str, tp: int, share: float, backend: str | None) -> dict:
    from transformers import AutoTokenizer

    from harness.gpu import module_determinism, tier
    from harness.runtime import batch_checks
    from harness.runtime.generator import HarnessGenerator, Options

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)
    prompts = tier.load_prompts(tier.DEFAULT_PROMPTS, tokenizer)
    out: dict = {"model_path": Path(model_path).name, "prompts": len(prompts), "tokens": sum(map(len, prompts))}
    t0 = time.perf_counter()
    gen = HarnessGenerator(model_path, None, gpu_memory_utilization=share, tensor_parallel_size=tp,
                           options=Options(dtype="bfloat16", attention_backend=backend, language_model_only=True))
    try:
        out["generator_start_s"] = round(time.perf_counter() - t0, 1)
        out["moe_methods"] = tier.moe_methods_of(gen)
        rpc = gen.real_executor.collective_rpc
        for label in ("vllm_order", "canonical_order"):
            if label == "canonical_order":
                out["engaged"] = rpc("_harness_call", args=(engage,))
            a, b = gen.generate(prompts), gen.generate(prompts)
            out[label] = {"same_batch_twice": _compare(a, b),
                          "diagnosis": module_determinism.diagnose(gen, prompts)}
            alone = [gen.generate([p])[0] for p in prompts]
            out[label]["alone_vs_batch"] = _compare(a, alone)
            big = batch_checks.straddling_batch(int(gen.vllm_config.scheduler_config.max_num_batched_tokens),
                                                gen.vocab_size)
            out[label]["fast_vs_loop"] = _compare(gen.generate(big), gen.generate(big, fast=True))
            print(label, json.dumps({k: v for k, v in out[label].items() if k != "diagnosis"}),
                  "culprit:", out[label]["diagnosis"].get("culprit"), flush=True)
    finally:
        gen.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.gpu.moe_order", description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    ap.add_argument("--attention-backend", default="TRITON_MLA")
    args = ap.parse_args(argv)
    if not (Path(args.model_path) / "config.json").is_file():
        print(f"harness.gpu.moe_order: no config.json in {args.model_path}", file=sys.stderr)
        return 2
    from harness import versions

    result = experiment(args.model_path, args.tp, args.gpu_memory_utilization, args.attention_backend)
    result["versions"] = versions.snapshot()
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
