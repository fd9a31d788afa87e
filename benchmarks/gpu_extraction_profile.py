"""Where one extraction call spends its time at a 1.4B-parameter shape on CUDA, beside plain vLLM prefill.

    python benchmarks/gpu_extraction_profile.py --out profile.json [--repeats 6] [--prompts 32] [--tokens 256]

Tiny models measure launch overhead, not throughput; this builds a random bf16 Llama of ~1.4B parameters
(hidden 2048, 16 layers, 16 heads / 8 KV heads, head_dim 128, intermediate 11008, vocab 32000) with the
harness's own seeded generator (no hub), then times, median and spread of N after a warm-up each:

* plain vLLM: `LLM.generate(max_tokens=1)` on the same prompts (prefix caching off, speculators' limits);
* ours: `HarnessGenerator.generate`, split into phases by wrapping the objects speculators' loop calls:
  `scheduler.schedule`, `executor.execute_model` (the forward with the capture, one RPC round trip),
  `collective_rpc("_get_captured_states")` (concatenation on the worker, serialisation through the
  executor's message queue, deserialisation here), the harness's own RPCs, and the rest (speculators'
  slicing and `.cpu()`, our regrouping and row checks).

Needs a CUDA build of vLLM; writes a JSON report and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager

SHAPE = {
    "description": "Random bf16 Llama of ~1.4B parameters, the shape of the performance issue's measurement.",
    "seed": 20261202, "family": "llama",
    "hf_config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
                  "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 16,
                  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
                  "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                  "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
                  "torch_dtype": "bfloat16"},
}


def spread(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "all_s": times}


class PhaseTimer:
    """Accumulates wall time per phase name during one call."""

    def __init__(self):
        self.totals: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0

    def wrap(self, obj, attr: str, name=None):
        inner = getattr(obj, attr)

        def call(*args, **kwargs):
            label = name(args) if callable(name) else (name or attr)
            with self.phase(label):
                return inner(*args, **kwargs)
        setattr(obj, attr, call)


def rpc_label(args) -> str:
    method = args[0] if args else "?"
    method = method if isinstance(method, str) else getattr(method, "__name__", "rpc")
    return "rpc " + method


def prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(5)
    return [[rng.randrange(4, vocab) for _ in range(length)] for _ in range(n)]


def plain(path: str, batch, repeats: int, enforce_eager: bool) -> dict:
    from vllm import LLM, SamplingParams

    from harness.bench import _shutdown

    llm = LLM(model=path, dtype="bfloat16", max_model_len=2048, enforce_eager=enforce_eager,
              enable_prefix_caching=False, max_num_seqs=32, max_num_batched_tokens=8192,
              gpu_memory_utilization=0.35, seed=0)
    try:
        sp = SamplingParams(max_tokens=1, temperature=0.0)
        reqs = [{"prompt_token_ids": p} for p in batch]
        llm.generate(reqs, sp, use_tqdm=False)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            llm.generate(reqs, sp, use_tqdm=False)
            times.append(time.perf_counter() - t0)
    finally:
        _shutdown(llm)
    return spread(times)


def ours(path: str, batch, repeats: int) -> dict:
    from harness.generator import HarnessGenerator, Options

    with HarnessGenerator(path, None, max_model_len=2048, gpu_memory_utilization=0.35,
                          options=Options(dtype="bfloat16")) as gen:
        gen.generate(batch)
        timer = PhaseTimer()
        timer.wrap(gen.scheduler, "schedule", "scheduler.schedule")
        timer.wrap(gen.executor_view, "execute_model", "execute_model (forward + capture)")
        timer.wrap(gen.executor_view, "collective_rpc", rpc_label)
        times, phases = [], []
        for _ in range(repeats):
            timer.totals = {}
            t0 = time.perf_counter()
            results = gen.generate(batch)
            times.append(time.perf_counter() - t0)
            phases.append(dict(timer.totals, **{"rest (slicing, .cpu(), regroup, checks)":
                                                 times[-1] - sum(timer.totals.values())}))
        layers = list(gen.layer_ids)
        captured = sum(h.numel() * h.element_size() for r in results for h in r["hidden_states"])
    median = {k: statistics.median(p.get(k, 0.0) for p in phases) for k in phases[0]}
    return {**spread(times), "layer_ids": layers, "captured_bytes": captured, "phases_median_s": median}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    from harness import models

    t0 = time.perf_counter()
    model = models.build("bench-llama-1b4", fixture=SHAPE)
    built_s = time.perf_counter() - t0
    batch = prompts(args.prompts, args.tokens, SHAPE["hf_config"]["vocab_size"])
    tokens = args.prompts * args.tokens
    out = {"shape": SHAPE["hf_config"], "prompts": args.prompts, "tokens": tokens, "repeats": args.repeats,
           "checkpoint_build_s": built_s}
    out["plain_eager"] = plain(str(model.path), batch, args.repeats, True)
    out["ours"] = ours(str(model.path), batch, args.repeats)
    for key in ("plain_eager", "ours"):
        out[key]["tokens_per_s"] = tokens / out[key]["median_s"]
    out["ratio_ours_over_plain_eager"] = out["ours"]["tokens_per_s"] / out["plain_eager"]["tokens_per_s"]
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"{tokens} tokens ({args.prompts} x {args.tokens}), median of {args.repeats}:")
    for key in ("plain_eager", "ours"):
        r = out[key]
        print(f"  {key:12s} {r['median_s'] * 1e3:8.1f} ms (min {r['min_s'] * 1e3:.1f}, max {r['max_s'] * 1e3:.1f}) "
              f"{r['tokens_per_s']:10.0f} tok/s")
    print(f"  ratio ours / plain (eager): {out['ratio_ours_over_plain_eager']:.3f}; captured "
          f"{out['ours']['captured_bytes'] / 2**20:.0f} MiB, layers {out['ours']['layer_ids']}")
    for name, s in out["ours"]["phases_median_s"].items():
        print(f"    {name:45s} {s * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
