"""Tiny checkpoints: deterministic, complete for transformers, and cached atomically."""

from __future__ import annotations

import json

import pytest
import torch

from harness.subjects import models


@pytest.mark.parametrize("name", models.fixture_names())
def test_generation_is_deterministic(name, tmp_path):
    a = models.build(name, root=tmp_path / "a")
    b = models.build(name, root=tmp_path / "b")
    assert a.fingerprint == b.fingerprint
    assert (a.path / "model.safetensors").read_bytes() == (b.path / "model.safetensors").read_bytes()
    assert (a.path / "tokenizer.json").read_bytes() == (b.path / "tokenizer.json").read_bytes()


def test_seed_changes_the_weights(tmp_path):
    fx = models.load_fixture("tiny-llama")
    other = json.loads(json.dumps(fx))
    other["seed"] += 1
    assert (
        models.build("tiny-llama", tmp_path, fx).fingerprint != models.build("tiny-llama", tmp_path, other).fingerprint
    )


#: sha256 over the tensors of the checkpoints every committed report (reports/vllm*.json) was observed on. The
#: weights come from transformers' enumeration and the harness's seeded draw: a change of either that alters
#: them fails here (the committed reports would then describe other weights).
OBSERVED_FINGERPRINTS = {
    "tiny-llama": "aa7e25d8b4f72fb5",
    "tiny-deepseek-v3": "cf8ab9c83135041f",
    "tiny-kimi-k25": "52bceb5a1c925c87",
    "tiny-qwen3": "b4a76dd3cac0f82d",
    "tiny-gemma2": "411f6e2640a643d1",
    "tiny-cohere": "fb2a66a4f3eea450",
    "tiny-gemma3": "e977a6f64c5c680d",
    "tiny-granite": "bf69f5958e1766e9",
    "tiny-olmo2": "440991d28b152420",
}


@pytest.mark.parametrize("name", sorted(OBSERVED_FINGERPRINTS))
def test_weights_are_the_ones_the_reports_observed(name, tmp_path):
    assert models.build(name, root=tmp_path).fingerprint[:16] == OBSERVED_FINGERPRINTS[name]


@pytest.mark.parametrize("name", models.fixture_names())
def test_transformers_loads_every_weight(name, tmp_path):
    """Every fixture, the one added as a file only (tiny-qwen3) included: no key missing, unexpected or of another
    shape (the build checks this itself; this shows the check ran on what was written)."""
    from transformers import AutoModelForCausalLM

    from harness.subjects import reference

    m = models.build(name, root=tmp_path)
    model, info = AutoModelForCausalLM.from_pretrained(
        str(reference._causal_lm_dir(m.path)), dtype=torch.float32, output_loading_info=True
    )
    assert {k: v for k, v in info.items() if v} == {}
    assert model.config.num_hidden_layers == m.num_layers


def test_an_incomplete_checkpoint_is_refused(tmp_path):
    """What the per-family layouts could not catch: a checkpoint missing a weight transformers expects."""
    from safetensors.torch import load_file, save_file

    from harness.subjects import reference

    m = models.build("tiny-qwen3", root=tmp_path)
    state = load_file(str(m.path / "model.safetensors"))
    del state["model.layers.1.self_attn.q_norm.weight"]
    save_file(state, str(m.path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"does not load cleanly in transformers: missing_keys: .*layers\.1\.self_attn\.q_norm"
    ):
        reference.check_loads(m.path)


def test_tied_embeddings_are_written_once(tmp_path):
    names = {n for n, _, _ in models.weight_layout(models.load_fixture("tiny-qwen3"))}
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_per_expert_layout_whatever_transformers_keeps_in_memory():
    """transformers 5 fuses experts in memory; the checkpoint keeps DeepSeek-V3's per-expert names."""
    layout = {n: (shape, kind) for n, shape, kind in models.weight_layout(models.load_fixture("tiny-kimi-k25"))}
    assert layout["language_model.model.layers.1.mlp.experts.7.down_proj.weight"] == ((256, 128), "linear")
    assert layout["language_model.model.layers.1.mlp.gate.e_score_correction_bias"][1] == "bias"
    assert layout["language_model.model.embed_tokens.weight"][1] == "embed"
    assert not any("vision" in n for n in layout)


def test_cache_reuses_a_finished_build_and_leaves_no_temp(tmp_path):
    first = models.build("tiny-llama", root=tmp_path)
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns
    again = models.build("tiny-llama", root=tmp_path)
    assert again.path == first.path and (again.path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]


def test_unknown_fixture_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no tiny-model fixture 'nope'"):
        models.build("nope")


def test_deepseek_latent_norm_eps_matches_transformers(tmp_path):
    """Why DeepseekV3 matches transformers to float32 noise: transformers builds q_a/kv_a_layernorm with a
    fixed eps, vLLM with rms_norm_eps; the fixture's rms_norm_eps must be that fixed value."""
    from transformers import AutoModelForCausalLM

    m = models.build("tiny-deepseek-v3", root=tmp_path)
    model = AutoModelForCausalLM.from_pretrained(str(m.path), dtype=torch.float32)
    attn = model.model.layers[0].self_attn
    assert attn.kv_a_layernorm.variance_epsilon == m.text_config["rms_norm_eps"]
    assert attn.q_a_layernorm.variance_epsilon == m.text_config["rms_norm_eps"]


def test_kimi_dims_are_kimis():
    c = models.load_fixture("tiny-deepseek-v3")["hf_config"]
    assert (c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]) == (512, 64, 128, 128)
    assert (c["topk_method"], c["scoring_func"]) == ("noaux_tc", "sigmoid")
    assert c["num_attention_heads"] % 8 == 0


def test_bad_layer_ids_and_configs_are_refused_before_vllm(tmp_path):
    """Layer ids and config.json are checked before anything starts (no vLLM needed to refuse them)."""
    import json

    import pytest

    from harness.runtime.generator import HarnessGenerator, HarnessInputError

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"num_hidden_layers": 6, "vocab_size": 512, "hidden_size": 64}))
    for ids, says in (
        ([], "the list is empty"),
        ("2", "must be a list of ints, got str '2'"),
        ("12", "got str '12'"),
        ([2.0], r"must be ints, got \[2.0\] \(float\)"),
        ([True], r"\[True\] \(bool\)"),
        (3, "got int 3"),
        ([0, 6], r"\[6\] out of range"),
    ):
        with pytest.raises(HarnessInputError, match=says):
            HarnessGenerator(ckpt, ids)
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(HarnessInputError, match=r"ckpt/config.json is not a readable JSON file"):
        HarnessGenerator(ckpt, [1])
    (ckpt / "config.json").write_text(json.dumps({"vocab_size": 512, "hidden_size": 64}))
    with pytest.raises(HarnessInputError, match=r"ckpt/config.json lacks num_hidden_layers"):
        HarnessGenerator(ckpt, [1])
