"""The GPU benchmarks' real shapes, and how each engine is started on them.

Tiny models measure launch overhead, not throughput. Each shape here is a random checkpoint built with the
harness's own seeded generator (no hub; stored in bf16) on the GPU machine itself:

* `llama1b4`: Llama, hidden 2048, 16 layers, 16 heads / 8 KV heads, intermediate 11008, vocab 32000
  (~1.4B parameters: the shape of the performance issue's first measurement);
* `llama8b`: Llama-3-8B's shape: hidden 4096, 32 layers, 32 heads / 8 KV heads, intermediate 14336,
  vocab 128256;
* `kimi-wide`: Kimi-K2.5 (KimiK25ForConditionalGeneration, language model only) at the real width: hidden
  7168, MLA with q_lora 1536 / kv_lora 512 / qk_rope 64 / qk_nope 128 / v_head 128, 64 heads, vocab 163840,
  first layer dense (intermediate 18432), then MoE layers (moe_intermediate 2048, top-8 of the routed experts,
  one shared expert, noaux_tc / sigmoid). Depth and expert count are cut (`KIMI_LAYERS`, `KIMI_EXPERTS`) so
  that both engines fit on one H200 beside each other and the checkpoint builds and loads inside one call.

Used by gpu_extraction_profile.py, gpu_batch_shapes.py, gpu_batch_invariance.py and suites/gpu/h200_tier_shape.sh.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.gpu import flops as model_flops  # noqa: E402 - after the path set-up
from harness.gpu import kimi_int4  # noqa: E402

KIMI_LAYERS = 8
KIMI_EXPERTS = 32

LLAMA_1B4 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}
LLAMA_8B = {
    **LLAMA_1B4,
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}
#: Kimi-K2.5's language model at its real width (harness.gpu.kimi_int4.TEXT, the released config's numbers), cut to
#: KIMI_LAYERS and KIMI_EXPERTS; the routing and scaling keys stay tiny-kimi-k25's.
ROUTING_KEYS = ("moe_layer_freq", "topk_method", "scoring_func", "norm_topk_prob", "routed_scaling_factor")
KIMI_TEXT = {k: v for k, v in kimi_int4.TEXT.items() if k not in ROUTING_KEYS} | {
    "num_hidden_layers": KIMI_LAYERS,
    "n_routed_experts": KIMI_EXPERTS,
}


def shape_fixture(name: str) -> dict:
    """The fixture (as in fixtures/models/) of a benchmark shape: seeded, stored in bf16."""
    if name in ("llama1b4", "llama8b"):
        cfg = LLAMA_1B4 if name == "llama1b4" else LLAMA_8B
        return {
            "description": f"benchmark shape {name}",
            "seed": 20261202,
            "store_dtype": "bfloat16",
            "hf_config": copy.deepcopy(cfg),
        }
    if name == "kimi-wide":
        from harness.subjects import models

        fx = copy.deepcopy(models.load_fixture("tiny-kimi-k25"))
        fx["description"] = "benchmark shape kimi-wide: Kimi-K2.5 at the real width, cut in depth and experts"
        fx["hf_config"]["torch_dtype"] = "bfloat16"
        fx["hf_config"]["text_config"].update(KIMI_TEXT)
        fx["store_dtype"] = "bfloat16"
        return fx
    raise SystemExit(f"unknown shape {name!r} (llama1b4, llama8b, kimi-wide)")


def flop_model(fixture: dict) -> dict:
    """Parameters by role (from the harness's weight layout of the shape) and the attention dimensions."""
    from harness.subjects import models

    return model_flops.flop_model(
        fixture["hf_config"], [(n, tuple(shape), "BF16") for n, shape, _ in models.weight_layout(fixture)]
    )


def start_ours(model, max_model_len: int, share: float, backend: str | None):
    from harness.runtime.generator import HarnessGenerator, options_for

    opts = options_for(model, dtype="bfloat16", **({"attention_backend": backend} if backend else {}))
    return HarnessGenerator(model.path, None, max_model_len=max_model_len, gpu_memory_utilization=share, options=opts)


def start_plain(model, max_model_len: int, share: float, backend: str | None):
    from harness.scenarios import bench

    return bench.plain_engine(
        model.path,
        "bfloat16",
        max_model_len,
        gpu_memory_utilization=share,
        language_model_only=bool((model.run_options or {}).get("language_model_only")),
        attention_backend=backend,
    )
