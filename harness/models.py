"""Tiny checkpoints, generated offline and deterministically from `fixtures/models/*.json`.

Nothing is downloaded. Every weight is drawn from its own seeded generator (seed = the fixture's
seed + CRC32 of the tensor name), so a checkpoint depends only on the fixture file: not on the
installed transformers, not on the order tensors are created in. The weight names are written out
here per architecture, in the layout real checkpoints use (per-expert MoE weights, as DeepSeek-V3
and Kimi-K2.5 ship them), so the same files load in vLLM and in transformers 4.x and 5.x.

Checkpoints are cached under `cache_dir()` keyed by a hash of the fixture and of this generator's
version; a build goes to a temporary folder that is renamed into place, so an interrupted build
never leaves a half-written model behind.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from harness.paths import FIXTURES, REPO_ROOT

MODELS_FIXTURES = FIXTURES / "models"
#: Bump when the weight layout or the init rule changes: it is part of the cache key.
GENERATOR_VERSION = 8


@dataclass(frozen=True)
class TinyModel:
    name: str
    path: Path
    family: str
    hf_config: dict
    fingerprint: str
    run_options: dict = None  # harness.runtime.generator.Options fields this model needs (e.g. language_model_only)

    @property
    def text_config(self) -> dict:
        """The decoder's config: the wrapper's `text_config` for multimodal wrappers."""
        return self.hf_config.get("text_config", self.hf_config)

    @property
    def num_layers(self) -> int:
        return int(self.text_config["num_hidden_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.text_config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.text_config["vocab_size"])

    @property
    def architecture(self) -> str:
        return self.hf_config["architectures"][0]


def cache_dir() -> Path:
    """Where generated checkpoints live (`HARNESS_CACHE_DIR`, else `<repo>/.cache/models`)."""
    return Path(os.environ.get("HARNESS_CACHE_DIR", REPO_ROOT / ".cache" / "models"))


def fixture_names() -> list[str]:
    return sorted(p.stem for p in MODELS_FIXTURES.glob("*.json"))


def load_fixture(name: str) -> dict:
    path = MODELS_FIXTURES / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no tiny-model fixture {name!r} in {MODELS_FIXTURES} (have: {', '.join(fixture_names())})"
        )
    return json.loads(path.read_text())


def _fixture_key(fixture: dict) -> str:
    blob = json.dumps(fixture, sort_keys=True).encode() + f"gen{GENERATOR_VERSION}".encode()
    return hashlib.sha256(blob).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Weight layouts, written out per architecture.
# Each entry: (name, shape, kind) with kind in {"linear", "embed", "norm", "bias"}.
# ---------------------------------------------------------------------------------------------


def _llama_weights(c: dict, prefix: str = "") -> list[tuple[str, tuple[int, ...], str]]:
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    nq, nkv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [(f"{prefix}model.embed_tokens.weight", (v, h), "embed")]
    for n in range(c["num_hidden_layers"]):
        p = f"{prefix}model.layers.{n}."
        out += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (nq, h), "linear"),
            (p + "self_attn.k_proj.weight", (nkv, h), "linear"),
            (p + "self_attn.v_proj.weight", (nkv, h), "linear"),
            (p + "self_attn.o_proj.weight", (h, nq), "linear"),
            (p + "mlp.gate_proj.weight", (i, h), "linear"),
            (p + "mlp.up_proj.weight", (i, h), "linear"),
            (p + "mlp.down_proj.weight", (h, i), "linear"),
        ]
    out += [(f"{prefix}model.norm.weight", (h,), "norm"), (f"{prefix}lm_head.weight", (v, h), "linear")]
    return out


def _mlp(p: str, h: int, i: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [
        (p + "gate_proj.weight", (i, h), "linear"),
        (p + "up_proj.weight", (i, h), "linear"),
        (p + "down_proj.weight", (h, i), "linear"),
    ]


def _deepseek_v3_weights(c: dict, prefix: str = "") -> list[tuple[str, tuple[int, ...], str]]:
    h, v, nh = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    nope, rope, vd, kvl = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    ql = c.get("q_lora_rank")
    out = [(f"{prefix}model.embed_tokens.weight", (v, h), "embed")]
    for n in range(c["num_hidden_layers"]):
        p = f"{prefix}model.layers.{n}."
        a = p + "self_attn."
        out += [(p + "input_layernorm.weight", (h,), "norm"), (p + "post_attention_layernorm.weight", (h,), "norm")]
        if ql:
            out += [
                (a + "q_a_proj.weight", (ql, h), "linear"),
                (a + "q_a_layernorm.weight", (ql,), "norm"),
                (a + "q_b_proj.weight", (nh * (nope + rope), ql), "linear"),
            ]
        else:
            out += [(a + "q_proj.weight", (nh * (nope + rope), h), "linear")]
        out += [
            (a + "kv_a_proj_with_mqa.weight", (kvl + rope, h), "linear"),
            (a + "kv_a_layernorm.weight", (kvl,), "norm"),
            (a + "kv_b_proj.weight", (nh * (nope + vd), kvl), "linear"),
            (a + "o_proj.weight", (h, nh * vd), "linear"),
        ]
        if n < c["first_k_dense_replace"]:
            out += _mlp(p + "mlp.", h, c["intermediate_size"])
            continue
        mi, ne = c["moe_intermediate_size"], c["n_routed_experts"]
        out += [(p + "mlp.gate.weight", (ne, h), "linear"), (p + "mlp.gate.e_score_correction_bias", (ne,), "bias")]
        for e in range(ne):
            out += _mlp(p + f"mlp.experts.{e}.", h, mi)
        if c.get("n_shared_experts"):
            out += _mlp(p + "mlp.shared_experts.", h, mi * c["n_shared_experts"])
    out += [(f"{prefix}model.norm.weight", (h,), "norm"), (f"{prefix}lm_head.weight", (v, h), "linear")]
    return out


def _kimi_k25_weights(c: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """Kimi-K2.5 names its text stack `language_model.model.*` and `language_model.lm_head`. Text only."""
    return _deepseek_v3_weights(c["text_config"], prefix="language_model.")


LAYOUTS = {"llama": _llama_weights, "deepseek_v3": _deepseek_v3_weights, "kimi_k25": _kimi_k25_weights}


def weight_layout(family: str, hf_config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    try:
        return LAYOUTS[family](hf_config)
    except KeyError:
        raise ValueError(f"unknown tiny-model family {family!r} (have: {', '.join(LAYOUTS)})") from None


def _draw(name: str, shape: tuple[int, ...], kind: str, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    if kind == "norm":
        return 1.0 + 0.1 * x
    if kind == "bias":
        return 0.01 * x
    if kind == "embed":
        return 0.5 * x
    fan_in = 1
    for d in shape[1:]:
        fan_in *= d
    scale = fan_in**-0.5
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        # Projections back into the residual stream are scaled down (as GPT-2's init does), so the
        # residual grows slowly and hidden states stay O(1) through the stack, like a trained model's.
        scale *= 0.25
    return x * scale


#: The config class a Kimi-K2.5 checkpoint ships for transformers (auto_map): ours, minimal. vLLM uses
#: its own KimiK25Config; speculators reads this one through AutoConfig(trust_remote_code=True).
KIMI_K25_CONFIG_CODE = '''"""Minimal Kimi-K2.5 config for transformers (written by the harness's tiny-model generator)."""
from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, media_placeholder_token_id=0, **kwargs):
        if isinstance(text_config, dict) or text_config is None:
            text_config = DeepseekV3Config(**{k: v for k, v in (text_config or {}).items() if k != "model_type"})
        self.text_config = text_config
        self.vision_config = dict(vision_config or {})
        self.media_placeholder_token_id = media_placeholder_token_id
        super().__init__(**kwargs)
'''


#: What tiny-Kimi's stand-in processor raises when asked about media (harness.reporting.attribution recognises it).
TEXT_ONLY_REFUSAL = "tiny-Kimi is a text-only checkpoint: it has no vision weights"
#: vLLM's Kimi-K2.5 processing info loads the checkpoint's image processor (remote code in real
#: checkpoints) even for text-only runs, and reads two attributes of it. tiny-Kimi is text-only: its
#: processor has those attributes and refuses media.
KIMI_K25_IMAGE_PROCESSOR_CODE = '''"""Text-only stand-in for Kimi-K2.5's image processor (written by the harness's tiny-model generator)."""
from transformers.image_processing_utils import BaseImageProcessor


class KimiK25ImageProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values", "grid_thws"]

    def __init__(self, num_frames_per_chunk=4, **kwargs):
        super().__init__(**kwargs)
        self.num_frames_per_chunk = num_frames_per_chunk

    def media_tokens_calculator(self, *args, **kwargs):
        raise NotImplementedError("tiny-Kimi is a text-only checkpoint: it has no vision weights")

    def preprocess(self, *args, **kwargs):
        raise NotImplementedError("tiny-Kimi is a text-only checkpoint: it has no vision weights")
'''
KIMI_K25_PREPROCESSOR = {
    "image_processor_type": "KimiK25ImageProcessor",
    "auto_map": {"AutoImageProcessor": "image_processing_kimi_k25.KimiK25ImageProcessor"},
    "num_frames_per_chunk": 4,
    # vLLM 0.32 builds its own fused processor from this block of a Kimi-K2.5 preprocessor config.
    "media_proc_cfg": {"patch_size": 14, "merge_kernel_size": [2, 2], "temporal_merge_kernel_size": 4,
                       "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "in_patch_limit": 1024,
                       "patch_limit_on_one_side": 64},
}


# ---------------------------------------------------------------------------------------------
# Tokenizer: byte-level, no merges, so it needs no training data and is identical everywhere.
# ---------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]


def _write_tokenizer(dest: Path, model_max_length: int) -> None:
    """tokenizer.json from `tokenizers` plus a hand-written tokenizer_config.json naming
    PreTrainedTokenizerFast: transformers' own save_pretrained writes class names that differ between
    4.x and 5.x, and the cached checkpoint is shared by envs of both."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(str(dest / "tokenizer.json"))
    special = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": False, **special}
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (dest / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


def _draw_all(layout, seed: int, store_dtype: str | None = None) -> dict:
    """Every tensor of `layout`, drawn in parallel threads: each has its own seeded generator, so the values
    do not depend on the threading (a benchmark-sized checkpoint of ~10^10 parameters then builds in
    seconds, not minutes). `store_dtype` (a fixture key, e.g. "bfloat16" for the GPU benchmark shapes)
    stores the drawn float32 values rounded to that dtype: half the disk and load time."""
    import torch
    from concurrent.futures import ThreadPoolExecutor

    def one(item):
        name, shape, kind = item
        t = _draw(name, shape, kind, seed).contiguous()
        return name, (t.to(getattr(torch, store_dtype)) if store_dtype else t)

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        return dict(pool.map(one, layout))


def _build_into(dest: Path, fixture: dict) -> str:
    import torch
    from safetensors.torch import save_file

    cfg = copy.deepcopy(fixture["hf_config"])
    layout = weight_layout(fixture["family"], cfg)
    tensors = _draw_all(layout, fixture["seed"], fixture.get("store_dtype"))
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    text = cfg.get("text_config", cfg)
    gen = {"bos_token_id": text.get("bos_token_id", 1), "eos_token_id": text.get("eos_token_id", 2)}
    (dest / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    _write_tokenizer(dest, int(text.get("max_position_embeddings", 2048)))
    if cfg.get("model_type") == "kimi_k25":
        (dest / "configuration_kimi_k25.py").write_text(KIMI_K25_CONFIG_CODE)
        (dest / "image_processing_kimi_k25.py").write_text(KIMI_K25_IMAGE_PROCESSOR_CODE)
        (dest / "preprocessor_config.json").write_text(json.dumps(KIMI_K25_PREPROCESSOR, indent=2) + "\n")
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].reshape(-1).view(torch.uint8).numpy())  # the tensor's bytes, as stored
    del torch
    return digest.hexdigest()


def build(name: str, root: Path | None = None, fixture: dict | None = None) -> TinyModel:
    """Return the tiny checkpoint `name`, generating it on first use (atomic, cached).

    `fixture` replaces the committed fixture file (used to derive variants, e.g. the GPU tier's).
    """
    fixture = fixture if fixture is not None else load_fixture(name)
    root = Path(root) if root is not None else cache_dir()
    final = root / f"{name}-{_fixture_key(fixture)}"
    marker = final / "harness-model.json"
    if not marker.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            fp = _build_into(tmp, fixture)
            (tmp / "harness-model.json").write_text(
                json.dumps({"fixture": name, "fingerprint": fp, "generator": GENERATOR_VERSION}, indent=2) + "\n"
            )
            try:
                os.rename(tmp, final)
            except OSError:
                # Another process finished the same build first; its result is identical.
                if not marker.is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads(marker.read_text())
    return TinyModel(name, final, fixture["family"], fixture["hf_config"], meta["fingerprint"],
                     dict(fixture.get("run_options", {})))
