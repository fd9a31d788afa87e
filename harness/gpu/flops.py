"""Model FLOPs of a prefill call and the MFU they give, for the GPU benchmark and the GPU tier alike.

Model FLOPs = 2 x (non-embedding parameters active per token) x tokens + causal attention (per layer and
prompt of s tokens: 2 x s^2 x heads x (qk_dim + v_dim) / 2, i.e. QK^T and PV with half the scores masked)
+ the LM head on one token per prompt (prefill samples one token). Routed-expert parameters count
top-k / n_routed_experts of their number (the share a token uses). MFU divides the FLOPs by the call's
seconds and by the peak rate: 790 TFLOP/s, the bf16 dense rate measured on this project's H200.
Parameters are counted from the checkpoint's own tensors: the harness's weight layout for the generated
shapes, the safetensors headers for a real checkpoint (a packed integer weight counts its unpacked values).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

PEAK_FLOPS = 790e12  # bf16 dense, measured on the project's H200

#: Bits per stored element of the safetensors dtypes a packed weight can have.
_BITS = {"I32": 32, "U32": 32, "I64": 64, "U8": 8, "I8": 8, "I16": 16}


def checkpoint_tensors(path: str | Path) -> list[tuple[str, tuple, str]]:
    """(name, shape, dtype) of every tensor in a checkpoint's safetensors files, read from their headers only."""
    out = []
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        out += [(k, tuple(v["shape"]), v["dtype"]) for k, v in header.items() if k != "__metadata__"]
    return out


def _packed_bits(config: dict) -> int | None:
    """The weight bits of a compressed-tensors pack-quantized checkpoint (Kimi-K2.5: int4 in int32), else None."""
    q = config.get("quantization_config") or config.get("text_config", {}).get("quantization_config") or {}
    for group in (q.get("config_groups") or {}).values():
        bits = (group.get("weights") or {}).get("num_bits")
        if bits:
            return int(bits)
    return None


def flop_model(config: dict, tensors: list[tuple[str, tuple, str]]) -> dict:
    """Parameters by role and the attention dimensions, from a HF config and the checkpoint's tensors."""
    text = config.get("text_config", config)
    experts = int(text.get("n_routed_experts") or text.get("num_experts") or 0)
    topk = int(text.get("num_experts_per_tok") or 0)
    bits = _packed_bits(config)
    total = embed = head = 0
    active: float = 0  # routed experts count by the share of them a token runs
    for name, shape, dtype in tensors:
        if name.endswith(("weight_scale", "weight_zero_point", "weight_shape", "weight_global_scale")):
            continue  # quantization metadata, not parameters
        n = 1
        for d in shape:
            n *= d
        if name.endswith("weight_packed") and bits and dtype in _BITS:
            n *= _BITS[dtype] // bits
        total += n
        if "embed_tokens" in name:
            embed += n
        elif "lm_head" in name:
            head += n
        elif ".experts." in name and experts:
            active += n * topk / experts
        elif "vision" in name or "mm_projector" in name or "multi_modal" in name:
            continue  # text prefill never runs the vision tower
        else:
            active += n
    heads = int(text["num_attention_heads"])
    if "qk_nope_head_dim" in text:
        qk = int(text["qk_nope_head_dim"]) + int(text["qk_rope_head_dim"])
        v = int(text["v_head_dim"])
    else:
        qk = v = int(text.get("head_dim") or text["hidden_size"] // heads)
    return {
        "params_total": total,
        "params_embedding": embed,
        "params_lm_head": head,
        "params_active_per_token": int(active),
        "layers": int(text["num_hidden_layers"]),
        "heads": heads,
        "qk_dim": qk,
        "v_dim": v,
    }


def seeded_tensors(path: str | Path, config: dict) -> list[tuple[str, tuple, str]]:
    """The tensors of a folder without weights on disk (harness.runtime.inputs.SEEDED_MARKER), from its config as
    transformers lays the model out (the marker's `weights_from`, as a fixture's, or that of the release it names),
    unpacked; [] where it says neither."""
    import copy

    from harness.runtime.inputs import SEEDED_MARKER
    from harness.subjects import models

    marker = Path(path) / SEEDED_MARKER
    said = json.loads(marker.read_text()) if marker.is_file() else {}
    spec = said.get("weights_from")
    if spec is None and said.get("release"):
        from harness.gpu import kimi_int4  # its folders name the release; the layout is its fixture's

        spec = kimi_int4.fixture(int(said["layers"]))["weights_from"] if said["release"] == kimi_int4.RELEASE else None
    if spec is None:
        return []
    cfg = copy.deepcopy(config)
    for c in (cfg, cfg.get(spec.get("config_key") or "", {})):
        c.pop("quantization_config", None)  # the layout is the unquantized one; packing does not change the count
    return [
        (name, shape, "BF16") for name, shape, _kind in models.weight_layout({"hf_config": cfg, "weights_from": spec})
    ]


def checkpoint_flop_model(path: str | Path) -> dict:
    config = json.loads((Path(path) / "config.json").read_text())
    return flop_model(config, checkpoint_tensors(path) or seeded_tensors(path, config))


def call_flops(fm: dict, lengths: list[int]) -> float:
    """Model FLOPs of one prefill call over prompts of these lengths."""
    tokens = sum(lengths)
    attention = sum(fm["layers"] * 2 * s * s * fm["heads"] * (fm["qk_dim"] + fm["v_dim"]) / 2 for s in lengths)
    return 2 * fm["params_active_per_token"] * tokens + attention + 2 * fm["params_lm_head"] * len(lengths)


def mfu(flops: float, seconds: float, peak: float = PEAK_FLOPS) -> float:
    return flops / seconds / peak
