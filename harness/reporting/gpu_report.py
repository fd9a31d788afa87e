"""The GPU tier's dated report: what the tier checked and measured on one real checkpoint, and its drift."""

from __future__ import annotations

import json
from pathlib import Path

from harness.gpu import tier as gpu_tier
from harness.reporting.report import write_atomic
from harness.support.paths import REPORTS

#: The committed GPU reports: a baseline for a nightly that writes elsewhere (a CI runner's fresh checkout).
COMMITTED = REPORTS / "gpu"


def write(model_name: str, cfg, prompts: list[list[int]], facts: dict, meta: dict) -> None:
    """`reports/gpu/<date>-<model>-tp<N>-<dtype>-vllm<version>.{json,md}` for one tier run, with its drift against the last
    report of the same run key (model config + weights, TP, dtype, prompts, layer ids)."""
    name = f"{gpu_tier.report_name(model_name, cfg.tp, cfg.dtype)}-vllm{meta.get('vllm')}"
    date = gpu_tier.today()
    fp = facts.get("fingerprint", {})
    key = gpu_tier.run_key(cfg.model_path, cfg.tp, cfg.dtype, prompts, facts.get("layer_ids", []))
    prev = gpu_tier.baseline(
        [Path(cfg.report_dir), COMMITTED], key["key"], date, exclude=Path(cfg.report_dir) / f"{date}-{name}.json"
    )
    drift = gpu_tier.compare(prev[1].get("fingerprint") if prev else None, fp, prev[0] if prev else None)
    rep = {
        "schema": "harness-gpu-report/1",
        "date": date,
        "model": model_name,
        "run_key": key,
        "config": gpu_tier.asdict_config(cfg),
        "versions": {k: meta.get(k) for k in ("vllm", "vllm_distribution", "speculators", "torch", "transformers")},
        "device": gpu_tier.device_info(),
        **facts,
        "drift": drift.__dict__,
    }
    out = Path(cfg.report_dir)
    write_atomic(out / f"{date}-{name}.json", json.dumps(rep, indent=2, default=str) + "\n")
    write_atomic(out / f"{date}-{name}.md", markdown(rep))


def markdown(rep: dict) -> str:
    dev = rep["device"]
    lines = [
        f"# GPU tier: {rep['model']} — TP={rep['config']['tp']}, {rep['config']['dtype']} ({rep['date']})",
        "",
        f"Device: {', '.join(dev.get('nvidia_smi') or dev.get('devices') or ['none'])}; torch {dev.get('torch')} "
        f"(CUDA {dev.get('torch_cuda')}); vLLM {rep['versions'].get('vllm')}, speculators {rep['versions'].get('speculators')}, "
        f"transformers {rep['versions'].get('transformers')}.",
        "",
        f"Generator start {rep.get('generator_start_s')} s; layers {rep.get('layer_ids')}; shims engaged: "
        f"{rep.get('engaged_shims')}; MLA disabled: {rep.get('mla_disabled')}.",
        "",
        "| check | result | measured |",
        "|---|---|---|",
    ]
    for c in rep.get("checks", []):
        lines.append(f"| {c['check']} | {c['result']} | {c['measured']} |")
    if rep.get("throughput"):
        t = rep["throughput"]
        lines += [
            "",
            f"Throughput: {t['tokens']} tokens in {t['seconds']:.3f} s = {t['tokens_per_s']:.0f} tokens/s "
            f"(steady call; first call {t['first_call_s']:.3f} s).",
        ]
    if rep.get("throughput_vs_prefill"):
        t = rep["throughput_vs_prefill"]
        lines += [
            "",
            f"Against plain prefill ({t['mode']}, {t['pairs']} calls a side, {t['tokens']} tokens): plain "
            f"{t['plain_tokens_per_s']:.0f} tok/s (MFU {t['plain_mfu']:.1%} a GPU), extraction "
            f"{t['extract_tokens_per_s']:.0f} tok/s (MFU {t['extract_mfu']:.1%} a GPU): {t['verdict']}. "
            f"MFU: harness.gpu.flops ({t['flop_model']['params_active_per_token'] / 1e9:.2f}B active parameters a "
            f"token, {t['peak_flops'] / 1e12:.0f} TFLOP/s a GPU).",
        ]
    if rep.get("moe_methods"):
        lines += [
            "",
            "MoE layers' quantization method (rank 0): "
            + "; ".join(
                f"{name}: {m['layers']} layers ({', '.join(f'{k}={v}' for k, v in m['attributes'].items()) or 'no kernel attributes'})"
                if isinstance(m, dict)
                else f"{name}: {m}"
                for name, m in rep["moe_methods"].items()
            )
            + ".",
        ]
    if rep.get("peak_memory_bytes_per_rank"):
        lines.append(
            "Peak GPU memory per rank (torch allocated): "
            + ", ".join(f"{b / 2**30:.2f} GiB" for b in rep["peak_memory_bytes_per_rank"] if b is not None)
        )
    lines += ["", "| layer | rows | sha256 (first 16) | mean | std | absmax |", "|---|---|---|---|---|---|"]
    for layer, f in rep.get("fingerprint", {}).items():
        lines.append(
            f"| {layer} | {f['rows']} | {f['sha256'][:16]} | {f['mean']:.5g} | {f['std']:.5g} | {f['absmax']:.5g} |"
        )
    d = rep["drift"]
    lines += [
        "",
        f"Drift vs {d['compared_with'] or 'nothing'}: {d.get('outcome', 'DRIFT' if d['drifted'] else 'none').upper()}"
        + (" — " + "; ".join(d["changes"]) if d["changes"] else ""),
    ]
    return "\n".join(lines) + "\n"
