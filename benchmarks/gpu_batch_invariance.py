"""Is a prompt's extraction independent of its batch? vLLM's batch-invariant mode against its default, on one GPU.

    python benchmarks/gpu_batch_invariance.py --out r.json [--shape llama1b4] [--calls 60] [--modes off,on,on-eager]
        [--attention-backend TRITON_ATTN] [--max-model-len 3072] [--alone 3] [--diagnose 2]

Training data should not depend on what else was in the batch it was extracted with. vLLM ships a batch-invariant
mode (`VLLM_BATCH_INVARIANT=1`, read by each worker at start: deterministic matmul/softmax/mean kernels, no split-K,
on the backends it supports); this measures whether it gives that through the harness. For each mode the shimmed
generator is started once (the variable set for its workers, or unset) on the same seeded checkpoint (the shapes of
benchmarks/gpu_shapes.py, built on the machine), and runs the same `--calls` random calls: 1-48 prompts
of 1 to max-model-len tokens, growing and shrinking. In each call, `--alone` of its prompts (seeded choice) are also
extracted alone and compared with their rows in the batch, bit for bit. Recorded per mode: calls where every
compared prompt was bitwise equal, the largest difference, and the median time of a call (the modes run one after
the other, not paired: the cost is indicative). Results are written after every mode.

A mode is `off`, `on` (vLLM's switch only), `on-norm` (`Options(batch_invariant=True)`: the switch, and the harness's
residual norm in place of vLLM's, harness.runtime.batch_invariant_norm), each also with `-eager` (vLLM's
enforce_eager: no torch.compile, no CUDA graphs). What each worker ran with is recorded (whether vLLM's
batch-invariant switch is on there, the cuBLAS workspace settings, the compilation mode). For the first
`--diagnose` calls of a mode where a prompt alone differed from its rows in the batch,
harness.gpu.module_determinism.alone_vs_batch names the first module whose rows for that prompt changed on equal
input rows: the module that made the states depend on the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.runtime.batch_invariant_norm import MODE_ENV  # noqa: E402 - after the path set-up above


def call_plan(seed: int, calls: int, vocab: int, longest: int, max_prompts: int = 48) -> list[list[list[int]]]:
    """Random calls of 1..max_prompts prompts, mostly short, some up to `longest` tokens (seeded)."""
    rng = random.Random(seed)
    plan = []
    for _ in range(calls):
        count = rng.randint(1, max_prompts)
        lengths = [
            rng.randint(1, longest) if rng.random() < 0.25 else rng.randint(1, max(1, longest // 8))
            for _ in range(count)
        ]
        plan.append([[rng.randrange(4, vocab) for _ in range(n)] for n in lengths])
    return plan


def batch_invariant_mode_on():
    """Whether vLLM switched its batch-invariant kernels on in this process: the module's own flag, wherever this
    release keeps the module (`layers/` up to 0.25, `determinism/` later); a string saying why where none is found."""
    import importlib

    for where in ("vllm.model_executor.determinism.batch_invariant", "vllm.model_executor.layers.batch_invariant"):
        try:
            module = importlib.import_module(where)
        except ImportError:
            continue
        if hasattr(module, "vllm_is_batch_invariant"):
            return bool(module.vllm_is_batch_invariant())
        if hasattr(module, "_batch_invariant_MODE"):
            return bool(module._batch_invariant_MODE)
        return f"unknown: {where} has no switch this benchmark knows"
    return "unknown: no batch_invariant module in this vLLM"


def worker_mode(worker) -> dict:
    """(Runs on a worker.) What the worker runs with: vLLM's batch-invariant switch, cuBLAS's workspace settings,
    the compilation mode and CUDA graph mode."""
    import torch

    out = {k: os.environ.get(k) for k in (MODE_ENV, "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE")}
    out["batch_invariant_mode_on"] = batch_invariant_mode_on()
    cfg = getattr(worker, "vllm_config", None)
    comp = getattr(cfg, "compilation_config", None)
    out["compilation_mode"] = str(getattr(comp, "mode", getattr(comp, "level", None)))
    out["cudagraph_mode"] = str(getattr(comp, "cudagraph_mode", None))
    out["bf16_reduced_precision_reduction"] = str(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    return out


def alone_against_batch(gen, batch, got, picks) -> tuple[bool, float, int | None]:
    """Each picked prompt extracted alone against its rows in the batch: all bitwise equal, the largest
    difference, and the first picked prompt that differed."""
    import torch

    equal, diff, first_unequal = True, 0.0, None
    for i in picks:
        solo = gen.generate([batch[i]])[0]
        for a, b in zip(got[i]["hidden_states"], solo["hidden_states"], strict=True):
            if not torch.equal(a, b):
                equal, first_unequal = False, i if first_unequal is None else first_unequal
                diff = max(diff, float((a.float() - b.float()).abs().max()))
    return equal, diff, first_unequal


def run_mode(model, mode: str, plan, alone: int, args) -> dict:

    from harness.gpu import module_determinism
    from harness.runtime.generator import HarnessGenerator, Options

    harness_option = "norm" in mode.split("-")  # Options(batch_invariant=True) sets the switch and engages the norm
    if mode.split("-")[0] == "on" and not harness_option:
        os.environ[MODE_ENV] = "1"
    else:
        os.environ.pop(MODE_ENV, None)
    t0 = time.perf_counter()
    out = {
        "mode": mode,
        "env": {MODE_ENV: os.environ.get(MODE_ENV)},
        "enforce_eager": "eager" in mode.split("-"),
        "calls": [],
    }
    try:
        gen = HarnessGenerator(
            model.path,
            None,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.share,
            options=Options(
                dtype=args.dtype,
                attention_backend=args.attention_backend or None,
                enforce_eager=out["enforce_eager"],
                batch_invariant=harness_option,
            ),
        )
    except Exception as exc:  # a mode vLLM refuses for this model is a result: why, in vLLM's words
        out["start_error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        print(mode, json.dumps({"start_error": out["start_error"]}), flush=True)
        return out
    out["start_s"] = round(time.perf_counter() - t0, 1)
    if harness_option:
        out["norm"] = gen.batch_invariance[0]
        print(mode, json.dumps({"norm": out["norm"]}), flush=True)
    out["worker"] = gen.real_executor.collective_rpc("_harness_call", args=(worker_mode,))[0]
    print(mode, json.dumps({"worker": out["worker"]}), flush=True)
    rng = random.Random(args.seed + 1)
    diagnosed = 0
    try:
        for batch in plan:
            t = time.perf_counter()
            got = gen.generate(batch)
            seconds = time.perf_counter() - t
            picks = rng.sample(range(len(batch)), min(alone, len(batch)))
            equal, diff, first_unequal = alone_against_batch(gen, batch, got, picks)
            got = None
            record = {
                "prompts": len(batch),
                "tokens": sum(map(len, batch)),
                "seconds": seconds,
                "compared": len(picks),
                "bitwise": equal,
                "max_abs_diff": diff,
            }
            if first_unequal is not None and diagnosed < args.diagnose:
                diagnosed += 1
                others = [p for j, p in enumerate(batch) if j != first_unequal]
                record["diagnosis"] = module_determinism.alone_vs_batch(gen, batch[first_unequal], others)
                print(mode, json.dumps({"diagnosis": record["diagnosis"]}), flush=True)
            out["calls"].append(record)
    finally:
        gen.close()
    calls = out["calls"]
    out["summary"] = {
        "calls": len(calls),
        "bitwise_calls": sum(c["bitwise"] for c in calls),
        "max_abs_diff": max((c["max_abs_diff"] for c in calls), default=0.0),
        "median_call_s": statistics.median(c["seconds"] for c in calls) if calls else None,
        "tokens_per_s": (sum(c["tokens"] for c in calls) / sum(c["seconds"] for c in calls)) if calls else None,
    }
    print(mode, json.dumps(out["summary"]), flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="llama1b4", help="a shape of benchmarks/gpu_shapes.py or a fixture")
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--alone", type=int, default=3, help="prompts of each call also extracted alone and compared")
    p.add_argument("--modes", default="off,on", help="comma-separated: off, on, on-norm; each with -eager too")
    p.add_argument("--diagnose", type=int, default=0, help="calls per mode whose alone-vs-batch difference is traced")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--max-model-len", type=int, default=3072)
    p.add_argument("--share", type=float, default=0.45)
    p.add_argument("--attention-backend", default="TRITON_ATTN", help="empty: vLLM's choice")
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    from harness.installed import versions
    from harness.subjects import models

    try:
        from gpu_shapes import shape_fixture

        fixture = shape_fixture(args.shape)
        model = models.build(f"bench-{args.shape}", fixture=fixture)
    except SystemExit:  # not a benchmark shape: a committed fixture (tiny-llama, ...)
        model = models.build(args.shape)
    plan = call_plan(args.seed, args.calls, model.vocab_size, args.max_model_len - 1)
    result = {
        "shape": args.shape,
        "attention_backend": args.attention_backend,
        "seed": args.seed,
        "calls_planned": len(plan),
        "alone_per_call": args.alone,
        "versions": versions.snapshot(),
        "modes": {},
    }
    for mode in [m for m in args.modes.split(",") if m]:
        result["modes"][mode] = run_mode(model, mode, plan, args.alone, args)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
