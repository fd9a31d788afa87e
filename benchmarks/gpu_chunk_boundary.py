"""Where a prompt extracted inside a multi-step batch departs from itself extracted alone, and from transformers.

The GPU tier's soak found tiny Kimi-K2.5 (MLA, TRITON_MLA, bf16) rows differing from the same prompt alone by ~2
in batches over one step's token budget, while tiny Llama stayed bitwise equal. This prints, per prompt, the rows
each forward captured of it (the chunk boundaries, from C-chunkedprefill's worker record) and the first row whose
difference from the prompt alone, and from transformers (float32), exceeds the bound: a departure that starts at
a chunk boundary is the chunked-context prefill's, one from row 0 is not.

    python benchmarks/gpu_chunk_boundary.py --model-path DIR --attention-backend TRITON_MLA [--prompts 16 --tokens 1500]
"""

from __future__ import annotations

import argparse
import json


def _segments(worker):
    return list(getattr(worker, "_harness_segments", []))


def main() -> int:
    import torch

    from harness.gpu.tier import bound
    from harness.runtime.generator import HarnessGenerator, Options
    from harness.subjects import reference
    from harness.subjects.prompts import random_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--max-model-len", type=int, default=2048)
    args = ap.parse_args()
    opts = Options(dtype=args.dtype, attention_backend=args.attention_backend, language_model_only=True)
    with HarnessGenerator(
        args.model_path, None, max_model_len=args.max_model_len, gpu_memory_utilization=0.3, options=opts
    ) as gen:
        prompts = random_prompts(args.prompts, args.tokens, args.tokens, gen.vocab_size, seed=7)
        batch = gen.generate(prompts)
        segments = gen.real_executor.collective_rpc("_harness_call", args=(_segments,))[0]
        alone = [gen.generate([p])[0] for p in prompts]
        layers = gen.layer_ids
    ref = reference.hidden_states(args.model_path, prompts, layers)
    chunks: dict[str, list[int]] = {}
    for step in segments:
        for req, n in step:
            chunks.setdefault(req, []).append(n)
    out = {"layers": layers, "chunks_per_request": list(chunks.values()), "prompts": []}
    for i in range(len(prompts)):
        rows = {}
        for k, (b, a, r) in enumerate(zip(batch[i]["hidden_states"], alone[i]["hidden_states"], ref[i], strict=True)):
            tol = bound(args.dtype, [a])
            d_alone = (b.float() - a.float()).abs().amax(dim=-1)
            d_ref_b = (b.float().cpu() - r.float().cpu()).abs().amax(dim=-1)
            d_ref_a = (a.float().cpu() - r.float().cpu()).abs().amax(dim=-1)
            first = lambda d, tol=tol: int(torch.nonzero(d > tol)[0]) if bool((d > tol).any()) else None  # noqa: E731
            rows[str(layers[k])] = {
                "tol": float(tol),
                "first_row_batch_vs_alone": first(d_alone),
                "max_batch_vs_alone": float(d_alone.max()),
                "first_row_batch_vs_transformers": first(d_ref_b),
                "max_batch_vs_transformers": float(d_ref_b.max()),
                "max_alone_vs_transformers": float(d_ref_a.max()),
            }
        out["prompts"].append(rows)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
