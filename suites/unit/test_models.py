"""Tiny checkpoints: deterministic, complete for transformers, and cached atomically."""

from __future__ import annotations

import json

import pytest
import torch

from harness import models


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
    assert models.build("tiny-llama", tmp_path, fx).fingerprint != models.build("tiny-llama", tmp_path, other).fingerprint


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek-v3"])
def test_transformers_loads_every_weight(name, tmp_path):
    from transformers import AutoModelForCausalLM

    m = models.build(name, root=tmp_path)
    model, info = AutoModelForCausalLM.from_pretrained(str(m.path), dtype=torch.float32, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}
    assert model.config.num_hidden_layers == m.num_layers


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
    for ids, says in (([], "the list is empty"), ("2", "must be a list of ints, got str '2'"),
                      ("12", "got str '12'"), ([2.0], r"must be ints, got \[2.0\] \(float\)"),
                      ([True], r"\[True\] \(bool\)"), (3, "got int 3"), ([0, 6], r"\[6\] out of range")):
        with pytest.raises(HarnessInputError, match=says):
            HarnessGenerator(ckpt, ids)
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(HarnessInputError, match=r"ckpt/config.json is not a readable JSON file"):
        HarnessGenerator(ckpt, [1])
    (ckpt / "config.json").write_text(json.dumps({"vocab_size": 512, "hidden_size": 64}))
    with pytest.raises(HarnessInputError, match=r"ckpt/config.json lacks num_hidden_layers"):
        HarnessGenerator(ckpt, [1])
