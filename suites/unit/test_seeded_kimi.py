"""Kimi-K2.5 as released without weights on disk: the config folder harness.gpu.kimi_int4 writes, the marker that
makes the generator and plain vLLM use the seeded loader, and the loader's fill (its GPU run is the tier's
report under reports/gpu/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.gpu import kimi_int4, seeded_loader
from harness.runtime.inputs import SEEDED_MARKER, HarnessInputError, check_weights, load_format_of

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_seeded_env_leaks(monkeypatch):
    """load_format_of sets HARNESS_SEEDED_LOADER for the engines this process starts: never past one test here."""
    monkeypatch.delenv("HARNESS_SEEDED_LOADER", raising=False)


def test_the_folder_is_the_released_shape_with_int4_experts_and_no_weights(tmp_path):
    path = kimi_int4.folder(3, root=tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    text = cfg["text_config"]
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"] and text["num_hidden_layers"] == 3
    assert (text["hidden_size"], text["n_routed_experts"], text["num_experts_per_tok"], text["vocab_size"]) == (
        7168,
        384,
        8,
        163840,
    )
    weights = text["quantization_config"]["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 32, True)
    assert text["quantization_config"]["format"] == "pack-quantized"
    assert not list(path.glob("*.safetensors")) and load_format_of(path) == seeded_loader.LOAD_FORMAT
    check_weights(path)  # accepted: the marker stands for the weights
    assert kimi_int4.folder(3, root=tmp_path) == path  # written once, keyed by content
    assert kimi_int4.folder(61, root=tmp_path) != path


def test_a_folder_without_weights_or_marker_is_refused_and_a_bad_marker_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(HarnessInputError, match="no weights"):
        check_weights(tmp_path)
    (tmp_path / SEEDED_MARKER).write_text("[1]")
    with pytest.raises(HarnessInputError, match=SEEDED_MARKER):
        load_format_of(tmp_path)


@pytest.mark.parametrize("layers", ["1", "62"])
def test_a_depth_outside_the_release_is_one_line_and_exit_2(tmp_path, layers, capsys):
    assert kimi_int4.main(["--layers", layers, "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "layers must be 2..61" in err[0] and not list(tmp_path.iterdir())


def test_every_tensor_is_seeded_by_name_at_a_trained_models_scales():
    """The loader's fill: the same name gives the same values in a fresh module, another name others; norms are 1,
    group scales positive, bf16 weights of the stated spread, the packed INT4 codes are -7..7 (centred), other
    integer tensors are zero; nothing keeps what the allocator left."""
    torch = pytest.importorskip("torch")

    def module():
        m = torch.nn.Module()
        m.input_layernorm = torch.nn.Module()
        m.input_layernorm.weight = torch.nn.Parameter(torch.full((64,), float("nan")), requires_grad=False)
        m.o_proj_weight = torch.nn.Parameter(
            torch.full((64, 256), float("nan"), dtype=torch.bfloat16), requires_grad=False
        )
        m.w13_weight_packed = torch.nn.Parameter(torch.empty(4, 256, dtype=torch.int32), requires_grad=False)
        m.w2_weight_packed = torch.nn.Parameter(torch.empty(4, 64, dtype=torch.int32), requires_grad=False)
        m.w2_weight_shape = torch.nn.Parameter(torch.full((4, 2), 7, dtype=torch.int32), requires_grad=False)
        m.w2_weight_scale = torch.nn.Parameter(torch.full((4, 2), -0.5, dtype=torch.bfloat16), requires_grad=False)
        return m

    a, b = module(), module()
    assert seeded_loader.seed_weights(a) == {"norm": 1, "scale": 1, "packed": 2, "weight": 1, "zeroed": 1}
    seeded_loader.seed_weights(b)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert not torch.equal(a.w13_weight_packed, a.w2_weight_packed)
    nibbles = ((a.w13_weight_packed.view(-1, 1) >> torch.arange(0, 32, 4)) & 0xF).view(-1)
    assert set(nibbles.tolist()) == set(range(1, 16))  # codes -7..7 (offset binary): centred, no -8
    assert abs(float((nibbles - 8).float().mean())) < 0.5
    assert bool((a.input_layernorm.weight == 1).all()) and int(a.w2_weight_shape.abs().sum()) == 0
    std = seeded_loader.WEIGHT_STD
    scale = a.w2_weight_scale.float()
    assert float(scale.min()) > 0 and float(scale.max()) < 1.5 * std / seeded_loader.INT4_CODE_STD * 1.01
    assert abs(float(a.o_proj_weight.float().std()) - std) < 0.1 * std


def test_the_entry_point_is_the_one_pyproject_declares_and_a_checkout_can_expose_it(tmp_path):
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    group, name, target = seeded_loader.ENTRY_POINT
    assert declared[group][name] == target
    seeded_loader.write_entry_point(tmp_path)
    code = (
        "from importlib.metadata import entry_points; "
        f"print([e.value for e in entry_points(group={group!r}) if e.name == {name!r}])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    ).stdout
    assert target in out


def test_a_seeded_folder_has_an_identity_for_the_drift_baseline(tmp_path):
    from harness.gpu import tier

    ident = tier.weights_identity(kimi_int4.folder(3, root=tmp_path))
    assert ident["files"] == 0 and SEEDED_MARKER in ident["method"]
    assert ident["sha256"] != tier.weights_identity(kimi_int4.folder(4, root=tmp_path))["sha256"]


def test_the_full_depth_config_is_kimi_k2_5_s_size():
    """The 61-layer folder counts as the release is described (1T parameters, ~32B active a token with embeddings
    and head): its parameters from the config as transformers lays it out, since there are no files to read (the
    tier's MFU uses the same count)."""
    import tempfile

    from harness.gpu import flops

    fm = flops.checkpoint_flop_model(kimi_int4.folder(61, root=Path(tempfile.mkdtemp())))
    assert 1.0e12 < fm["params_total"] < 1.05e12, fm
    assert 30e9 < fm["params_active_per_token"] + fm["params_embedding"] + fm["params_lm_head"] < 34e9, fm


def test_the_loader_registers_only_where_the_harness_asked(tmp_path):
    """vLLM loads general plugins in every process; the hook does nothing (imports nothing of vLLM) unless a seeded
    folder was asked for, which sets SEEDED_ENV for the processes vLLM starts."""
    code = (
        "import sys; from harness.gpu import seeded_loader; seeded_loader.register(); "
        "print('vllm.model_executor.model_loader' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_SEEDED_LOADER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "False"
    os.environ.pop("HARNESS_SEEDED_LOADER", None)
    load_format_of(kimi_int4.folder(3, root=tmp_path))
    try:
        assert os.environ["HARNESS_SEEDED_LOADER"] == "1"
    finally:
        os.environ.pop("HARNESS_SEEDED_LOADER", None)
