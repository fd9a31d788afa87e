"""Marlin MoE's token order: one canonical layout, and the GPU proof that it makes INT4 MoE extraction repeatable.

vLLM's Marlin MoE path (the kernel it picks for Kimi-K2.5's INT4 experts) groups each expert's tokens with
`moe_align_block_size`, which places them with atomics: the same routing gives different (equally legal) layouts
from call to call, and Marlin's output depends on where a token sits (vllm-project/vllm#52525, open). The GPU tier
found the consequence on the Kimi-K2.5 INT4 slice: the same batch twice is not bitwise equal, and the first module
whose output changes on equal inputs is the routed experts' runner (harness.gpu.module_determinism).

`canonical_order` (harness.contracts.moeorder, C-moeorder's shim) sorts each expert's run of token slots (padding,
the largest id, stays last): one layout for one routing. `engage(worker)` wraps the aligner with it in that worker.

    python -m harness.gpu.moe_order --model-path DIR --out r.json [--tp 1] [--gpu-memory-utilization 0.45]

starts the shimmed generator once on DIR and records, on the tier's prompts: the same batch twice without and then
with the canonical order (bitwise? max abs diff; the module the diagnosis blames), each prompt alone against the
batch, and the fast path against speculators' loop. The generator starts with C-moeorder's shim left out (the
first half is vLLM's own order), and the second half engages it: the contract's proof, needed and sufficient, on
the states themselves.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.contracts.moeorder import ALIGNER, marlin_module
from harness.contracts.moeorder import engage as engage_module


def engage(worker) -> bool:
    """(Runs on a worker.) Wrap Marlin MoE's aligner with `canonical_order`; False where vLLM has no such module."""
    module = marlin_module()
    return module is not None and hasattr(module, ALIGNER) and engage_module(module)


def _compare(first, second) -> dict:
    import torch

    pairs = [
        (a, b)
        for r1, r2 in zip(first, second, strict=True)
        for a, b in zip(r1["hidden_states"], r2["hidden_states"], strict=True)
    ]
    bitwise = all(torch.equal(a, b) for a, b in pairs)
    diff = 0.0 if bitwise else max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    return {"bitwise": bitwise, "max_abs_diff": diff}


def experiment(model_path: str, tp: int, share: float, backend: str | None) -> dict:
    from transformers import AutoTokenizer

    from harness.gpu import module_determinism, tier
    from harness.runtime.generator import HarnessGenerator, Options
    from harness.subjects import batches

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)
    prompts = tier.load_prompts(tier.DEFAULT_PROMPTS, tokenizer)
    out: dict = {"model_path": Path(model_path).name, "prompts": len(prompts), "tokens": sum(map(len, prompts))}
    t0 = time.perf_counter()
    gen = HarnessGenerator(
        model_path,
        None,
        gpu_memory_utilization=share,
        tensor_parallel_size=tp,
        disable={"moeorder"},
        options=Options(dtype="bfloat16", attention_backend=backend, language_model_only=True),
    )
    try:
        out["generator_start_s"] = round(time.perf_counter() - t0, 1)
        out["moe_methods"] = tier.moe_methods_of(gen)
        rpc = gen.real_executor.collective_rpc
        for label in ("vllm_order", "canonical_order"):
            if label == "canonical_order":
                out["engaged"] = rpc("_harness_call", args=(engage,))
            a, b = gen.generate(prompts), gen.generate(prompts)
            out[label] = {"same_batch_twice": _compare(a, b), "diagnosis": module_determinism.diagnose(gen, prompts)}
            alone = [gen.generate([p])[0] for p in prompts]
            out[label]["alone_vs_batch"] = _compare(a, alone)
            big = batches.straddling_batch(int(gen.vllm_config.scheduler_config.max_num_batched_tokens), gen.vocab_size)
            out[label]["fast_vs_loop"] = _compare(gen.generate(big), gen.generate(big, fast=True))
            print(
                label,
                json.dumps({k: v for k, v in out[label].items() if k != "diagnosis"}),
                "culprit:",
                out[label]["diagnosis"].get("culprit"),
                flush=True,
            )
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
    from harness.installed import versions

    result = experiment(args.model_path, args.tp, args.gpu_memory_utilization, args.attention_backend)
    result["versions"] = versions.snapshot()
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
