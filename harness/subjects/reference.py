"""The numeric reference: transformers' forward over the same checkpoint files.

speculators captures `hidden_states + residual` after decoder layer k, before the final norm. In
transformers that is `output_hidden_states[k + 1]` (index 0 is the embeddings) for every layer but
the last: transformers applies the final norm to its last entry, `hidden_states[n]`, so for
k = n - 1 the reference is the last decoder layer's own output, taken with a forward hook.
`LAYER_OFFSET` holds the one-layer shift in one place; the e2e suite shows offset 0 does not match.

transformers runs with its eager attention (`ATTENTION`): the fused implementations it defaults to (SDPA) leave
out features a config may use (Gemma-2's attention-logit soft-capping), and a reference that silently drops one
blames vLLM for the difference. Eager implements every feature the configs here use.

An extraction is compared with the float64 forward of the same checkpoint (`against`), and held to a bound derived
from the reference's own error on the same prompts: transformers' float32 result differs from its float64 one by
`reference_error`, the size of float32 rounding through this network at these magnitudes; an extraction in float32
by another implementation (other kernels, other reduction orders, MLA's absorbed factorisation) may sit `SLACK`
times that far from float64, never less than `SLACK` float32 ulps of the largest state (no float32 result is closer
to the truth than its own rounding). So Gemma-3, whose states reach ~30, gets the room its rounding takes, and a
model of magnitude 1-4 keeps a bound of a few 1e-6; a real break (a skipped scale, a wrong layer, a wrong residual)
moves the states by their own size. Measured on vLLM 0.16's CPU build in float32 (max |extraction - float64| over
transformers' own float32 error, same prompts): tiny Llama 1.1, Qwen3 0.95, Gemma-3 0.64 (3.7e-5 at magnitude 35,
where transformers' float32 result is 5.8e-5 off); Cohere's wrong states 2.4, some 300,000 times its bound.
In float64, a module that computes in float32 on purpose (a MoE router) hands its output on as float64.

`tolerance()` is the bound for comparisons of one implementation with itself (a prompt alone vs inside a batch,
TP=2 vs TP=1): `ULPS` units in the last place of the largest value, and never below `FLOOR`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

#: speculators' layer id k  <->  transformers' hidden_states[k + LAYER_OFFSET]
LAYER_OFFSET = 1
#: transformers' attention implementation for the reference (see the module's docstring).
ATTENTION = "eager"
#: The bound against the reference: ULPS x float32 eps x the largest reference value, at least FLOOR.
ULPS = 8
FLOOR = 1e-5


#: How many times transformers' own float32 error an extraction may sit from the float64 reference (see above):
#: measured 0.6-1.1; 8 leaves room for kernels that round differently, far below any break's size.
SLACK = 8


@dataclass(frozen=True)
class Comparison:
    """An extraction against the float64 reference, with the bound derived from the reference's float32 error."""

    diff: float  # max |extraction - float64 reference|
    reference_error: float  # max |transformers float32 - float64| on the same prompts and layers
    magnitude: float  # the largest reference value

    @property
    def bound(self) -> float:
        import torch

        return SLACK * max(self.reference_error, float(torch.finfo(torch.float32).eps) * self.magnitude)

    @property
    def held(self) -> bool:
        return self.diff <= self.bound

    def said(self) -> str:
        return (
            f"max abs diff {self.diff:.2e} from float64 (bound {self.bound:.2g} = {SLACK} x transformers' own "
            f"float32 error {self.reference_error:.2g} at magnitude {self.magnitude:.3g})"
        )


def against(results, model_path, prompts, layer_ids, *, offset: int = LAYER_OFFSET) -> Comparison:
    """`results` (per prompt, per layer id: tensors, as an extraction returns them) against the float64 reference."""
    r64 = hidden_states(model_path, prompts, layer_ids, offset=offset, dtype="float64")
    r32 = hidden_states(model_path, prompts, layer_ids, offset=offset)
    return Comparison(
        diff=_max_diff(results, r64),
        reference_error=_max_diff(r32, r64),
        magnitude=max((float(t.abs().max()) for per in r64 for t in per if t.numel()), default=0.0),
    )


def _max_diff(a, b) -> float:
    return max(
        float((x.double() - y.double()).abs().max())
        for pa, pb in zip(a, b, strict=True)
        for x, y in zip(pa, pb, strict=True)
    )


def tolerance(refs) -> float:
    """The bound for a comparison with reference tensors `refs` (nested lists of tensors)."""
    import torch

    def flat(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                yield from flat(y)
        else:
            yield x

    magnitude = max((float(t.abs().max()) for t in flat(refs) if t.numel()), default=0.0)
    return max(FLOOR, ULPS * float(torch.finfo(torch.float32).eps) * magnitude)


@lru_cache(maxsize=4)
def load(model_path: str, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(_causal_lm_dir(Path(model_path))), dtype=getattr(torch, dtype), attn_implementation=ATTENTION
    ).eval()
    if dtype == "float64":
        _hand_on_in_float64(model)
        _experts_in_eager(model)
    return model


def _experts_in_eager(model) -> None:
    """transformers' MoE experts may dispatch to `torch.nn.functional.grouped_mm` (transformers 5.x, its default where
    torch has it), which takes float32, bfloat16 or float16 only: a float64 forward of DeepseekV3 or Kimi-K2.5 stops
    there ("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double"). Their own per-expert loop
    (`eager`) computes the same function in any dtype, so the float64 reference asks for it. Nothing changes where
    transformers has no such dispatch (no `_experts_implementation` on the config)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_experts_implementation"):
            config._experts_implementation = "eager"


def _hand_on_in_float64(model) -> None:
    """Modules that compute in float32 on purpose (DeepseekV3's router casts to float32 and hands float32 routing
    weights to an index_add into the hidden states) would stop a float64 forward: every module's float32 output is
    handed on as float64. The reference stays float64 wherever the model computes it so."""
    import torch

    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
            return x.double()
        if isinstance(x, tuple):
            return tuple(up(y) for y in x)
        return x

    for module in model.modules():
        module.register_forward_hook(lambda mod, args, out: up(out))


def check_loads(model_path) -> None:
    """Load a generated checkpoint in transformers and refuse it if any weight is missing, unexpected or of
    another shape (transformers would initialise or drop those silently; vLLM fails later, in its worker)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    _, info = AutoModelForCausalLM.from_pretrained(str(_causal_lm_dir(Path(model_path))), output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ValueError(
            f"the checkpoint generated in {Path(model_path).name} does not load cleanly in transformers: "
            + "; ".join(f"{k}: {sorted(map(str, v))[:5]}" for k, v in bad.items())
        )


def _causal_lm_dir(path: Path) -> Path:
    """The folder transformers loads as a causal LM: the checkpoint itself, or, where the generator recorded that
    the weights are a sub-model's under a prefix (Kimi-K2.5's DeepseekV3 text model under `language_model.`), a
    checkpoint of just that sub-model, written once beside the weights."""
    marker = path / "harness-model.json"
    spec = json.loads(marker.read_text()).get("weights", {}) if marker.is_file() else {}
    if not spec.get("prefix"):
        return path
    text_dir = path / "reference-text-model"
    if not (text_dir / "config.json").is_file():
        _write_sub_checkpoint(path, spec, text_dir)
    return text_dir


def _write_sub_checkpoint(path: Path, spec: dict, dest: Path) -> None:
    import os
    import tempfile

    from safetensors.torch import load_file, save_file
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = json.loads((path / "config.json").read_text())
    prefix, model_type = spec["prefix"], spec["model_type"]
    state = {
        k[len(prefix) :]: v
        for f in sorted(path.glob("*.safetensors"))
        for k, v in load_file(str(f)).items()
        if k.startswith(prefix)
    }
    sub = config[spec["config_key"]] if spec.get("config_key") else config
    text = {**sub, "model_type": model_type, "architectures": [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]}
    tmp = Path(tempfile.mkdtemp(prefix=".reference-", dir=path))
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(text, indent=2))
    try:
        os.rename(tmp, dest)
    except OSError:
        if not (dest / "config.json").is_file():
            raise


def decoder_layers(model):
    return model.model.layers


def all_hidden_states(model, prompt: list[int]) -> list:
    """transformers' hidden_states for one prompt, the last entry replaced by the pre-norm layer output."""
    import torch

    seen: dict = {}
    layers = decoder_layers(model)
    hook = layers[-1].register_forward_hook(
        lambda mod, args, out: seen.__setitem__("last", out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            hs = list(model(torch.tensor([prompt]), output_hidden_states=True).hidden_states)
    finally:
        hook.remove()
    hs[len(layers)] = seen["last"]
    return [h[0] for h in hs]


def hidden_states(
    model_path: str | Path,
    prompts: list[list[int]],
    layer_ids: list[int],
    *,
    offset: int = LAYER_OFFSET,
    dtype: str = "float32",
) -> list[list]:
    """Per prompt, per requested layer id: the reference at index id + offset, for that prompt alone."""
    model = load(str(model_path), dtype)
    out = []
    for p in prompts:
        hs = all_hidden_states(model, p)
        out.append([hs[k + offset] for k in layer_ids])
    return out
