"""Kimi-K2.5 as it is released, for the GPU tier: the text model's real shape and its INT4 routed experts, at a depth
of our choosing, with no weights on disk.

The shape and the scheme are those of the public release (moonshotai/Kimi-K2.5, config.json and model card: a
DeepSeek-V3-shaped text model under KimiK25ForConditionalGeneration; hidden 7168, 64 MLA heads with q/kv LoRA ranks
1536/512, rope/nope/v head dims 64/128/128, vocab 163840, 61 layers of which the first is dense, 384 routed experts
of width 2048 with top-8 sigmoid routing (noaux_tc, one group, scaling 2.827) and one shared expert; routed experts
quantized with compressed-tensors, pack-quantized, symmetric INT4 weights in groups of 32, weight-only; attention,
shared experts, the dense layer, router, embeddings and head in bf16). The released file lists the unquantized
modules one by one; `QUANTIZATION` names the same set by pattern, which vLLM matches the same way.

The weights come from harness.gpu.seeded_loader (every tensor seeded by name at a trained model's scales): nothing is
written but the config folder, so the same command runs a 3-layer slice on one H200 and all 61 layers at TP=8 (the
INT4 checkpoint would be ~600 GB; the 8-GPU machine has 235 GB of disk).

    python -m harness.gpu.kimi_int4 --layers 3          # prints the folder (under the harness cache)
    harness gpu-nightly --model-path "$(python -m harness.gpu.kimi_int4 --layers 61)" --tp 8 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from harness.gpu.seeded_loader import LOAD_FORMAT

RELEASE = "moonshotai/Kimi-K2.5"
LAYERS = 61  # the released depth

TEXT = {
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": LAYERS,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.827,
    "torch_dtype": "bfloat16",
}

QUANTIZATION = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "output_activations": None,
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "strategy": "group",
                "group_size": 32,
                "dynamic": False,
                "actorder": None,
                "observer": "minmax",
            },
        }
    },
    "ignore": [
        "lm_head",
        "re:.*lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        r"re:.*mlp\.(gate|up|down)_proj$",
        "re:.*vision_tower.*",
        "re:.*mm_projector.*",
    ],
    "kv_cache_scheme": None,
}


def fixture(layers: int = 3) -> dict:
    """The tiny-kimi-k25 fixture (architecture, remote-code config, tiny vision config never built) with the
    released text model at `layers` layers and the released quantization."""
    from harness.subjects import models

    if not 2 <= layers <= LAYERS:
        raise ValueError(f"layers must be 2..{LAYERS} (one dense layer, then MoE layers), got {layers}")
    fx = copy.deepcopy(models.load_fixture("tiny-kimi-k25"))
    fx["description"] = (
        f"{RELEASE} as released (shape and INT4 routed experts) at {layers} of {LAYERS} layers; "
        f"weights from the {LOAD_FORMAT} loader"
    )
    text = fx["hf_config"]["text_config"]
    text.update(copy.deepcopy(TEXT), num_hidden_layers=layers, quantization_config=copy.deepcopy(QUANTIZATION))
    fx["hf_config"]["torch_dtype"] = "bfloat16"
    return fx


def folder(layers: int = 3, root: Path | None = None) -> Path:
    """The config folder of the `layers`-layer model (written once, atomically, keyed by its content)."""
    from harness.runtime.inputs import SEEDED_MARKER
    from harness.subjects import models

    fx = fixture(layers)
    key = hashlib.sha256(json.dumps(fx, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(root) if root is not None else models.cache_dir()
    final = root / f"kimi-k25-int4-{layers}l-{key}"
    if (final / SEEDED_MARKER).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".kimi-k25-int4-", dir=root))
    models.write_config_folder(tmp, fx)
    (tmp / SEEDED_MARKER).write_text(
        json.dumps({"load_format": LOAD_FORMAT, "release": RELEASE, "layers": layers}, indent=2) + "\n"
    )
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / SEEDED_MARKER).is_file():
            raise
    return final


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.gpu.kimi_int4",
        description="Write the config folder of Kimi-K2.5 as released, cut to --layers, "
        "loaded without weights on disk; print its path.",
    )
    ap.add_argument("--layers", type=int, default=3, help=f"depth, 2..{LAYERS} (default 3: one dense, two MoE)")
    ap.add_argument("--root", type=Path, help="where to write it (default: the harness model cache)")
    args = ap.parse_args(argv)
    try:
        print(folder(args.layers, args.root))
    except ValueError as e:
        print(f"harness.gpu.kimi_int4: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
