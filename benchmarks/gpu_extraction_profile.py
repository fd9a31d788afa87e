"""Extraction against plain vLLM prefill on one GPU at real shapes: paired throughput, per-phase profile, MFU.

    python benchmarks/gpu_extraction_profile.py --shape llama1b4 --out r.json [--pairs 6] [--prompts 32]
        [--min-tokens 256 --max-tokens 256] [--cprofile] [--before]

Each shape is a seeded random checkpoint built on the GPU machine (benchmarks/gpu_shapes.py).

Both engines are started once, extraction (`HarnessGenerator`, speculators' own generator through the
shims) first and then plain vLLM with the same scheduler limits (speculators': 32 sequences,
max(8192, max_model_len) tokens a step, eager, prefix caching off); they are timed in interleaved pairs
(`harness.scenarios.bench.paired`). Each extraction call is split into phases by wrapping the objects speculators'
loop calls (scheduler, execute_model, each RPC); "rest" is speculators' slicing and copies plus our checks.
`--cprofile` adds the top functions of one extraction call. `--transports shm` adds a round with the
end-of-batch hand-off on the same engines (the worker switches; `harness.runtime.transport`) and checks its
results equal the streamed hand-off's bit for bit. `--before` first times the pairs with the
unoptimised copy-out (`harness.runtime.transport.CopyOut(enabled=False)`: speculators' per-prompt copies on the one
torch thread vLLM leaves the caller, into fresh pages), then as shipped.

`--fast` adds a round of the harness's fast path (`generate(..., fast=True)`, harness.runtime.fast_path: the next
step scheduled while the worker runs the current one, results as views of the hand-off buffer) on the same engines
and prompts, paired with plain prefill the same way, and checks its results equal speculators' loop bit for bit;
`--fast-first` runs that round before speculators' own (to see an order effect).

`--gpu-profile` traces one call per hand-off in the worker (torch profiler, summarised there by
harness.gpu.trace: kernel time per stream, idle gaps, copies and whether their host memory was pinned, the host's
CUDA runtime calls).

`--native` then closes ours and times vLLM's own export against the same plain engine (benchmarks/gpu_native_export.py);
`--native-only` starts no extraction engine; `--layer-ids` then names the layers.

MFU: model FLOPs = 2 x (non-embedding parameters active per token) x tokens + causal attention
(per layer and prompt of s tokens: 2 x s^2 x heads x (qk_dim + v_dim) / 2 x 2, i.e. QK^T and PV, half
masked) + the LM head on one token per prompt; divided by the call's time and by 790 TFLOP/s (the bf16
dense rate measured on this H200).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_native_export import measure_native, shm_free, speculators_default_ids  # noqa: E402 - after the path set-up
from gpu_shapes import flop_model, shape_fixture, start_ours, start_plain  # noqa: E402

from harness.contracts.base import strip_machine_paths  # noqa: E402
from harness.gpu import flops as model_flops  # noqa: E402
from harness.runtime.executor_view import PendingStep  # noqa: E402
from harness.subjects.prompts import random_prompts  # noqa: E402

#: Environment variables that change what is measured, recorded in the report beside every VLLM_* one.
RECORDED_ENV = ("THP_MEM_ALLOC_ENABLE", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF")


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


def fast_bitwise(gen, prompts) -> bool:
    """Whether the fast path gives speculators' loop's results bit for bit (one call each)."""
    import torch

    ref = gen.generate(prompts)
    res = gen.generate(prompts, fast=True)
    return all(
        torch.equal(a, b)
        for r1, r2 in zip(ref, res, strict=True)
        for a, b in zip(r1["hidden_states"], r2["hidden_states"], strict=True)
    )


def bitwise(gen, prompts, modes: list[str]) -> dict:
    """Whether each hand-off in `modes` gives the streamed one's results bit for bit (one call each)."""
    import torch

    gen.executor_view.collective_rpc("_harness_set_transport", args=("stream",))
    ref = gen.generate(prompts)
    out = {}
    for mode in modes:
        gen.executor_view.collective_rpc("_harness_set_transport", args=(mode,))
        res = gen.generate(prompts)
        out[mode] = all(
            torch.equal(a, b)
            for r1, r2 in zip(ref, res, strict=True)
            for a, b in zip(r1["hidden_states"], r2["hidden_states"], strict=True)
        )
        del res
    gen.executor_view.collective_rpc("_harness_set_transport", args=("stream",))
    return out


def gpu_profile(gen, prompts, mode: str, fast: bool = False) -> dict:
    """One call with hand-off `mode` (on the fast path with `fast`) under the torch profiler in the worker
    (harness.gpu.trace); its summary."""
    from harness.gpu import trace as gpu_trace

    view = gen.executor_view
    view.collective_rpc("_harness_set_transport", args=(mode,))
    gen.generate(prompts, fast=fast)  # the mode's first call after a switch is not the one traced
    summary = gpu_trace.traced(
        lambda: gen.generate(prompts, fast=fast), lambda fn: view.collective_rpc("_harness_call", args=(fn,))
    )
    view.collective_rpc("_harness_set_transport", args=("stream",))
    wall = summary["call_s"]
    print(f"[gpu profile, hand-off {mode!r}{', fast path' if fast else ''}] call {wall * 1e3:.1f} ms (traced)")
    for sid, s in summary["streams"].items():
        print(
            f"    stream {sid}: {s['kernels']} kernels {s['kernel_ms']:.1f} ms, covered {s['covered_ms']:.1f} ms, "
            f"span {s['span_ms']:.1f} ms, idle {s['idle_ms']:.1f} ms; copies "
            + ", ".join(
                f"{n} x{c['count']} {c['ms']:.1f} ms {c['bytes'] / 2**20:.0f} MiB" for n, c in s["copies"].items()
            )
        )
    for name, r in list(summary["runtime"].items())[:8]:
        print(f"    {name:40s} x{r['count']:6d} {r['ms']:9.1f} ms (longest {r['max_ms']:.2f} ms)")
    return summary


def host_profile(gen, prompts, fast: bool) -> list[str]:
    """cProfile of one call in this process: the top of the cumulative listing, machine paths left out."""
    prof = cProfile.Profile()
    prof.enable()
    gen.generate(prompts, fast=fast)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
    top = [strip_machine_paths(line) for line in text.getvalue().splitlines()[:80]]
    print("\n".join(top[:45]))
    return top


def native_only(out: dict, model, prompts, args) -> dict:
    """Plain prefill and vLLM's native export only, no engine of ours beside them."""
    from harness.scenarios import bench

    t0 = time.perf_counter()
    llm = start_plain(model, args.max_model_len, args.share, args.attention_backend)
    try:
        out["plain_start_s"] = time.perf_counter() - t0
        text = out["fixture"]["hf_config"].get("text_config", out["fixture"]["hf_config"])
        ids = args.layer_ids or speculators_default_ids(out["flop_model"]["layers"])
        estimate = out["tokens"] * len(ids) * int(text["hidden_size"]) * 4  # float32 at most: where the files go
        out["native"] = measure_native(
            model, bench.prefill_call(llm, prompts), prompts, ids, estimate, args, out["tokens"], out["flops_per_call"]
        )
    finally:
        bench.shutdown(llm)
    return out


def measure(args) -> dict:
    import torch

    from harness.runtime import transport
    from harness.scenarios import bench
    from harness.subjects import models

    fixture = shape_fixture(args.shape)
    t0 = time.perf_counter()
    model = models.build(f"bench-{args.shape}", fixture=fixture)
    built_s = time.perf_counter() - t0
    fm = flop_model(fixture)
    prompts = random_prompts(args.prompts, args.min_tokens, args.max_tokens, model.vocab_size, seed=5)
    lengths = [min(len(p), args.max_model_len - 1) for p in prompts]
    tokens = sum(lengths)
    flops = model_flops.call_flops(fm, lengths)
    out = {
        "shape": args.shape,
        "fixture": fixture,
        "flop_model": fm,
        "prompts": len(prompts),
        "prompt_tokens": [args.min_tokens, args.max_tokens],
        "tokens": tokens,
        "flops_per_call": flops,
        "peak_flops": model_flops.PEAK_FLOPS,
        "checkpoint_build_s": built_s,
        "shm_free_bytes": shm_free(),
        "gpu": torch.cuda.get_device_name(0),
        "max_model_len": args.max_model_len,
    }
    backend = args.attention_backend
    if args.native_only:  # plain prefill and vLLM's native export only (ours measured at this shape before)
        return native_only(out, model, prompts, args)
    t0 = time.perf_counter()
    gen = start_ours(model, args.max_model_len, args.share, backend)
    gen.__enter__()
    llm = None
    try:
        out["ours_start_s"] = time.perf_counter() - t0
        sc = gen.vllm_config.scheduler_config
        out["scheduler"] = {"max_num_seqs": sc.max_num_seqs, "max_num_batched_tokens": sc.max_num_batched_tokens}
        out["layer_ids"] = list(gen.layer_ids)
        t0 = time.perf_counter()
        llm = start_plain(model, args.max_model_len, args.share, backend)
        out["plain_start_s"] = time.perf_counter() - t0
        timer = PhaseTimer()
        timer.wrap(gen.scheduler, "schedule", "scheduler.schedule")
        timer.wrap(gen.executor_view, "execute_model", "execute_model (forward + capture)")
        timer.wrap(gen.executor_view, "collective_rpc", rpc_label)
        phases, kept = [], {}

        timer.wrap(gen.executor_view, "submit_step", "submit_step (send)")
        timer.wrap(PendingStep, "result", "step wait (forward + capture)")
        fast = {"on": False}

        def ours():
            timer.totals = {}
            t = time.perf_counter()
            kept["results"] = None  # as a training loop would: the previous batch is written out and dropped
            kept["results"] = gen.generate(prompts, fast=fast["on"])
            wall = time.perf_counter() - t
            phases.append(dict(timer.totals, rest=wall - sum(timer.totals.values())))

        plain = bench.prefill_call(llm, prompts)

        def one_round(label: str, transport_mode: str = "stream") -> dict:
            gen.executor_view.collective_rpc("_harness_set_transport", args=(transport_mode,))
            phases.clear()
            torch.cuda.reset_peak_memory_stats()
            r = bench.paired(plain, ours, pairs=args.pairs)
            r["phases_median_s"] = {k: statistics.median(p.get(k, 0.0) for p in phases[1:]) for k in phases[-1]}
            r["plain_tokens_per_s"] = tokens / r["plain_s"]["median"]
            r["extract_tokens_per_s"] = tokens / r["extract_s"]["median"]
            r["plain_mfu"] = flops / r["plain_s"]["median"] / model_flops.PEAK_FLOPS
            r["extract_mfu"] = flops / r["extract_s"]["median"] / model_flops.PEAK_FLOPS
            r["verdict"] = bench.verdict(r["ratio"])
            r["hand_offs"] = gen.executor_view.collective_rpc("_harness_set_transport", args=(transport_mode,))[0]
            print(
                f"[{label}] {r['verdict']}; plain {r['plain_tokens_per_s']:.0f} tok/s (MFU "
                f"{r['plain_mfu']:.1%}), extraction {r['extract_tokens_per_s']:.0f} tok/s (MFU {r['extract_mfu']:.1%})"
            )
            for k, v in r["phases_median_s"].items():
                print(f"    {k:45s} {v * 1e3:9.1f} ms")
            return r

        if args.before:  # the copy-out as it was before harness.runtime.transport.CopyOut (this process, first)
            gen.copy_out = transport.CopyOut(enabled=False)
            out["before"] = one_round("before: copy-out on vLLM's 1 thread, fresh pages")
            gen.copy_out = transport.CopyOut(workers=1)

        def fast_round() -> None:
            fast["on"] = True
            ahead = gen.steps_ahead
            out["fast"] = one_round("fast path (next step scheduled during the forward; results as views)")
            out["fast"]["steps_ahead_per_call"] = (gen.steps_ahead - ahead) / (args.pairs + 1)
            fast["on"] = False
            out["fast_bitwise_equal_to_speculators_loop"] = fast_bitwise(gen, prompts)
            print(f"fast path bitwise equal to speculators' loop: {out['fast_bitwise_equal_to_speculators_loop']}")

        if args.fast and args.fast_first:
            fast_round()
        out["shipped"] = one_round("as shipped (each step's rows leave during the next step)")
        if args.fast and not args.fast_first:
            fast_round()
        for mode in args.transports:  # earlier hand-offs, on the same engines (the worker switches)
            out[f"transport_{mode}"] = one_round(f"hand-off {mode!r}", mode)
        if args.transports:  # the shipped hand-off against each earlier one on the same prompts, bit for bit
            out["bitwise_equal_to_stream"] = bitwise(gen, prompts, args.transports)
            print(f"bitwise equal to the streamed hand-off: {out['bitwise_equal_to_stream']}")
        gen.executor_view.collective_rpc("_harness_set_transport", args=("stream",))
        for k in args.copy_threads:  # the copy-out with k torch threads (an experiment, not shipped)
            gen.copy_out = transport.CopyOut(threads=k)
            out[f"copy_threads_{k}"] = one_round(f"copy-out on {k} torch threads")
        gen.copy_out = transport.CopyOut(workers=1)
        out["copy_threads_shipped"] = gen.copy_out.threads
        res = kept["results"]
        out["captured_bytes"] = sum(h.numel() * h.element_size() for r in res for h in r["hidden_states"])
        out["peak_gpu_bytes_extraction_worker"] = gen.executor_view.collective_rpc("_harness_peak_memory")[0]
        out["torch_threads_outside_generate"] = torch.get_num_threads()
        if args.cprofile:  # of the fast path's call where --fast is given
            out["cprofile_top"] = host_profile(gen, prompts, args.fast)
        if args.gpu_profile:
            out["gpu_profile"] = {m: gpu_profile(gen, prompts, m) for m in ["stream", *args.transports]}
            if args.fast:
                out["gpu_profile"]["fast"] = gpu_profile(gen, prompts, "stream", fast=True)
        if args.native:
            layer_ids = list(gen.layer_ids)
            gen.__exit__(None, None, None)  # two engines at a time: ours is measured, the native export takes its place
            gen = None
            out["native"] = measure_native(model, plain, prompts, layer_ids, out["captured_bytes"], args, tokens, flops)
    finally:
        if llm is not None:
            bench.shutdown(llm)
        if gen is not None:
            gen.__exit__(None, None, None)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="llama1b4", choices=("llama1b4", "llama8b", "kimi-wide"))
    p.add_argument("--out", required=True)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--min-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--share", type=float, default=0.35, help="gpu_memory_utilization of each engine")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--cprofile", action="store_true")
    p.add_argument(
        "--copy-threads",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[],
        help="extra rounds with speculators' copy-out on k torch threads, e.g. 2,4,8",
    )
    p.add_argument("--before", action="store_true", help="first time the unoptimised copy-out (CopyOut off)")
    p.add_argument(
        "--transports",
        type=lambda v: [x for x in v.split(",") if x],
        default=[],
        help="after the shipped round, one round with each earlier hand-off (shm, rpc) and a bitwise check",
    )
    p.add_argument("--fast", action="store_true", help="a round of the fast path (generate(fast=True)) + bitwise check")
    p.add_argument("--fast-first", action="store_true", help="with --fast: its round before speculators' loop's")
    p.add_argument(
        "--gpu-profile",
        action="store_true",
        help="one traced call per hand-off (shipped and --transports): the worker's GPU time by stream",
    )
    p.add_argument("--native", action="store_true", help="then time vLLM's native export against plain prefill")
    p.add_argument("--native-only", action="store_true", help="plain prefill and the native export only (no ours)")
    p.add_argument(
        "--layer-ids",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="with --native-only: speculators' layer ids to export (default: speculators' own choice)",
    )
    args = p.parse_args()
    out = measure(args)
    out["environment"] = {k: v for k, v in os.environ.items() if k in RECORDED_ENV or k.startswith("VLLM_")}
    out["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
