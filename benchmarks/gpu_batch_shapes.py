"""Extraction against plain vLLM prefill at several batch shapes on one pair of engines, with a trace per shape.

    python benchmarks/gpu_batch_shapes.py --out r.json [--shape llama1b4] [--pairs 5] [--trace] [--device-output]
        [--waited]
        [--batches 16x2048,24x100-3000,8x4095,48x700,32x256] [--max-model-len 4096]

A ratio measured at one batch shape says little about the next: the fast path was 1.19x plain prefill at 32 x 256
and 0.87x at 48 x 700 on the same model. Here one seeded checkpoint (a shape of gpu_shapes.py, built on
the GPU machine) is loaded once into the shimmed generator and once into plain vLLM, and every batch shape is timed
on those two engines, each against plain prefill (`LLM.generate(max_tokens=1)`) in interleaved pairs after a
warm-up (`harness.scenarios.bench.paired`):

* `loop`: speculators' own loop, states handed to the host (as shipped);
* `fast`: the harness's fast path (`generate(..., fast=True)`), states on the host;
* `fast-waited` (with `--waited`): the fast path waiting for each step's follow-up call (C-twophase's
  `sample_tokens`) before sending the next step, as it did before `ExecutorView.steps_in_flight`;
* `fast-device` (with `--device-output`): the fast path with the states left on the GPU (`Options.states_on =
  "device"`, transport mode "device": a consumer that trains on the same GPU needs no host copy).

Each shape also checks the fast path's results (both outputs) against speculators' loop bit for bit. `--trace`
traces one call of plain prefill and one of the fast path per shape in the workers (harness.gpu.trace): kernel
time, idle gaps and copies per stream, the host's CUDA runtime calls; the per-shape breakdown says where the fast
path's extra time goes. A batch is `NxL` (N prompts of L tokens) or `NxA-B` (lengths drawn from A..B, seeded);
prompts longer than max_model_len - 1 are cut there by both engines alike. Results are written after each shape,
so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_BATCHES = "16x2048,24x100-3000,8x4095,48x700,32x256"
ROUNDS = ("loop", "fast", "fast-waited", "fast-device")


def parse_batch(text: str) -> tuple[int, int, int]:
    """`NxL` or `NxA-B` as (prompts, shortest, longest)."""
    try:
        count, lengths = text.lower().split("x")
        lo, _, hi = lengths.partition("-")
        out = int(count), int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"a batch is NxL or NxA-B (e.g. 16x2048, 24x100-3000), not {text!r}") from None
    if out[0] < 1 or out[1] < 1 or out[2] < out[1]:
        raise ValueError(f"a batch needs at least one prompt of at least one token and A <= B: {text!r}")
    return out


def equal_bitwise(ref: list[dict], res: list[dict]) -> bool:
    """Whether two calls' states are the same bits (compared on the host, wherever they came out)."""
    import torch

    return all(
        torch.equal(a, b.to(a.device))
        for r1, r2 in zip(ref, res, strict=True)
        for a, b in zip(r1["hidden_states"], r2["hidden_states"], strict=True)
    )


def trace_line(name: str, summary: dict) -> str:
    busiest = max(summary["streams"].values(), key=lambda s: s["kernel_ms"], default=None)
    if busiest is None:
        return f"    {name}: call {summary['call_s'] * 1e3:.1f} ms, no kernels traced"
    copies = sum(c["ms"] for s in summary["streams"].values() for c in s["copies"].values())
    return (
        f"    {name}: call {summary['call_s'] * 1e3:.1f} ms; compute stream kernels {busiest['kernel_ms']:.1f} ms, "
        f"idle {busiest['idle_ms']:.1f} ms; copies on all streams {copies:.1f} ms"
    )


class Rounds:
    """The extraction engine in one of the three ways a round runs it."""

    def __init__(self, gen, prompts):
        self.gen, self.prompts, self.kept = gen, prompts, None

    def set(self, name: str) -> None:
        mode = "device" if name == "fast-device" else "stream"
        view = self.gen.executor_view
        view.collective_rpc("_harness_set_transport", args=(mode,))
        view.follow_ups_behind = name != "fast-waited"
        self.fast = name != "loop"

    def call(self) -> list[dict]:
        self.kept = None  # as a training loop would: the previous batch is used and dropped
        self.kept = self.gen.generate(self.prompts, fast=self.fast)
        return self.kept


def measure_batch(gen, llm, model, fm, batch: tuple[int, int, int], args, seed: int) -> dict:
    from harness.gpu import flops as model_flops
    from harness.gpu import trace as gpu_trace
    from harness.scenarios import bench
    from harness.subjects.prompts import random_prompts

    n, lo, hi = batch
    prompts = random_prompts(n, lo, hi, model.vocab_size, seed=seed)
    lengths = [min(len(p), args.max_model_len - 1) for p in prompts]
    tokens, flops = sum(lengths), model_flops.call_flops(fm, lengths)
    out = {
        "batch": f"{n}x{lo}" + (f"-{hi}" if hi != lo else ""),
        "prompts": n,
        "tokens": tokens,
        "longest": max(lengths),
        "flops_per_call": flops,
        "rounds": {},
    }
    plain = bench.prefill_call(llm, prompts)
    rounds = Rounds(gen, prompts)
    names = [r for r in ROUNDS if (r != "fast-device" or args.device_output) and (r != "fast-waited" or args.waited)]
    for name in names:
        rounds.set(name)
        r = bench.paired(plain, rounds.call, pairs=args.pairs)
        r["plain_tokens_per_s"] = tokens / r["plain_s"]["median"]
        r["extract_tokens_per_s"] = tokens / r["extract_s"]["median"]
        r["plain_mfu"] = flops / r["plain_s"]["median"] / model_flops.PEAK_FLOPS
        r["extract_mfu"] = flops / r["extract_s"]["median"] / model_flops.PEAK_FLOPS
        out["rounds"][name] = r
        ratio = r["ratio"]
        print(
            f"[{out['batch']}] {name:12s} {ratio['median']:.3f}x plain prefill ({ratio['min']:.3f}-{ratio['max']:.3f}),"
            f" plain {r['plain_s']['median'] * 1e3:.1f} ms, extraction {r['extract_s']['median'] * 1e3:.1f} ms",
            flush=True,
        )
    rounds.set("loop")
    ref = rounds.call()
    rounds.kept = None
    for name in names[1:]:
        rounds.set(name)
        out[f"{name}_bitwise_equal_to_loop"] = equal_bitwise(ref, rounds.call())
        print(f"[{out['batch']}] {name} bitwise equal to speculators' loop: {out[f'{name}_bitwise_equal_to_loop']}")
    rounds.kept = ref = None
    if args.trace:
        out["trace"] = {}
        try:  # plain vLLM's engine core takes a function as an RPC only with insecure serialization (set in main)
            out["trace"]["plain"] = gpu_trace.traced(plain, llm.collective_rpc)
        except Exception as exc:  # noqa: BLE001 - the rest of the shape's results stand without it
            out["trace_plain_error"] = f"{type(exc).__name__}: {exc}"[:500]
        for name in names[1:]:
            rounds.set(name)
            rounds.call()  # a call after the switch first: the traced one is not the first in its mode
            out["trace"][name] = gpu_trace.traced(
                rounds.call, lambda fn: gen.executor_view.collective_rpc("_harness_call", args=(fn,))
            )
        for name, summary in out["trace"].items():
            print(trace_line(name, summary))
    rounds.set("loop")
    return out


def engine_modes(cfg) -> dict:
    """How an engine runs its steps, as its resolved config says (speculators builds its own config, the plain
    engine is vLLM's `LLM`): each setting changes where a step's time goes."""
    if cfg is None:
        return {}
    return {
        "async_scheduling": getattr(cfg.scheduler_config, "async_scheduling", None),
        "enforce_eager": cfg.model_config.enforce_eager,
    }


def measure(args) -> dict:
    import torch
    from gpu_shapes import flop_model, shape_fixture, start_plain

    from harness.runtime.generator import HarnessGenerator, options_for
    from harness.scenarios import bench
    from harness.subjects import models

    batches = [parse_batch(b) for b in args.batches.split(",") if b]
    fixture = shape_fixture(args.shape)
    t0 = time.perf_counter()
    model = models.build(f"bench-{args.shape}", fixture=fixture)
    out = {
        "shape": args.shape,
        "fixture": fixture,
        "flop_model": flop_model(fixture),
        "max_model_len": args.max_model_len,
        "pairs": args.pairs,
        "checkpoint_build_s": time.perf_counter() - t0,
        "gpu": torch.cuda.get_device_name(0),
        "batches": [],
    }
    backend = {"attention_backend": args.attention_backend} if args.attention_backend else {}
    gen = HarnessGenerator(
        model.path,
        None,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.share,
        options=options_for(model, dtype="bfloat16", **backend),
    )
    llm = None
    try:
        out["layer_ids"] = list(gen.layer_ids)
        sc = gen.vllm_config.scheduler_config
        out["scheduler"] = {"max_num_seqs": sc.max_num_seqs, "max_num_batched_tokens": sc.max_num_batched_tokens}
        llm = start_plain(model, args.max_model_len, args.share, args.attention_backend)
        out["engines"] = {
            "extraction": engine_modes(gen.vllm_config),
            "plain": engine_modes(getattr(getattr(llm, "llm_engine", None), "vllm_config", None)),
        }
        for i, batch in enumerate(batches):
            out["batches"].append(measure_batch(gen, llm, model, out["flop_model"], batch, args, seed=11 + i))
            write(args.out, out)
    finally:
        if llm is not None:
            bench.shutdown(llm)
        gen.close()
    return out


def write(path: str, out: dict) -> None:
    out["environment"] = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    out["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="llama1b4", choices=("llama1b4", "llama8b", "kimi-wide"))
    p.add_argument("--out", required=True)
    p.add_argument("--batches", default=DEFAULT_BATCHES, help="comma-separated NxL or NxA-B")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--share", type=float, default=0.4, help="gpu_memory_utilization of each engine")
    p.add_argument("--attention-backend", default=None)
    p.add_argument(
        "--trace", action="store_true", help="one traced call of plain prefill and of each fast round per shape"
    )
    p.add_argument("--device-output", action="store_true", help="a round of the fast path with the states on the GPU")
    p.add_argument(
        "--waited", action="store_true", help="a round of the fast path that waits for each step's follow-up call"
    )
    args = p.parse_args()
    try:  # a bad batch is one line before any engine starts
        [parse_batch(b) for b in args.batches.split(",")]
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.trace:  # plain vLLM's engine core then accepts the tracer's functions as RPCs (this benchmark only)
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    measure(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
