"""The numeric reference: transformers' forward over the same checkpoint files.

speculators captures `hidden_states + residual` after decoder layer k, before the final norm. In
transformers that is `output_hidden_states[k + 1]` (index 0 is the embeddings) for every layer but
the last: transformers applies the final norm to its last entry, `hidden_states[n]`, so for
k = n - 1 the reference is the last decoder layer's own output, taken with a forward hook.
`LAYER_OFFSET` holds the one-layer shift in one place; the e2e suite shows offset 0 does not match.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

#: speculators' layer id k  <->  transformers' hidden_states[k + LAYER_OFFSET]
LAYER_OFFSET = 1


@lru_cache(maxsize=4)
def load(model_path: str, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    config = json.loads((Path(model_path) / "config.json").read_text())
    if config.get("model_type") == "kimi_k25":
        return _kimi_text_model(Path(model_path), config, getattr(torch, dtype))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    return model.eval()


def _kimi_text_model(path: Path, config: dict, dtype):
    """Kimi-K2.5's text model is DeepseekV3: a DeepseekV3 checkpoint of the `language_model.*` weights,
    written once beside the model, loaded with from_pretrained (which also converts per-expert
    weights for transformers versions that fuse experts)."""
    from transformers import AutoModelForCausalLM

    text_dir = path / "reference-text-model"
    if not (text_dir / "config.json").is_file():
        _write_text_checkpoint(path, config, text_dir)
    return AutoModelForCausalLM.from_pretrained(str(text_dir), dtype=dtype).eval()


def _write_text_checkpoint(path: Path, config: dict, dest: Path) -> None:
    import os
    import tempfile

    from safetensors.torch import load_file, save_file

    prefix = "language_model."
    state = {k[len(prefix):]: v for f in sorted(path.glob("*.safetensors"))
             for k, v in load_file(str(f)).items() if k.startswith(prefix)}
    text = {**config["text_config"], "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
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

    seen = {}
    layers = decoder_layers(model)
    hook = layers[-1].register_forward_hook(
        lambda mod, args, out: seen.__setitem__("last", out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            hs = list(model(torch.tensor([prompt]), output_hidden_states=True).hidden_states)
    finally:
        hook.remove()
    hs[len(layers)] = seen["last"]
    return [h[0].float() for h in hs]


def hidden_states(model_path: str | Path, prompts: list[list[int]], layer_ids: list[int], *,
                  offset: int = LAYER_OFFSET, dtype: str = "float32") -> list[list]:
    """Per prompt, per requested layer id: the reference at index id + offset, for that prompt alone."""
    model = load(str(model_path), dtype)
    out = []
    for p in prompts:
        hs = all_hidden_states(model, p)
        out.append([hs[k + offset] for k in layer_ids])
    return out
