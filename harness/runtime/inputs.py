"""What a caller hands the generator, checked before anything starts: the checkpoint folder (a config, weights), the
layer ids and every batch of token ids. Each refusal is a `HarnessInputError` with one line that says what is
wrong; nothing here imports vLLM or torch.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path


class HarnessInputError(ValueError):
    """Bad input to the harness, said before anything starts."""


class TruncationWarning(UserWarning):
    """A prompt longer than max_model_len - 1 was cut (speculators cuts silently)."""


def read_model_config(model_path: str | os.PathLike) -> dict:
    path = Path(model_path)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise HarnessInputError(f"model path {str(path)!r} is not a local checkpoint folder with config.json")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HarnessInputError(f"{path / 'config.json'} is not a readable JSON file: {e}") from None
    if not isinstance(cfg, dict):
        raise HarnessInputError(f"{path / 'config.json'} is not a JSON object")
    missing = [k for k in ("num_hidden_layers", "vocab_size", "hidden_size") if k not in text_config(cfg)]
    if missing:
        raise HarnessInputError(f"{path / 'config.json'} lacks {', '.join(missing)}: not a decoder checkpoint's config")
    return cfg


#: What vLLM's default loader reads from a checkpoint folder (safetensors first, then PyTorch's formats).
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
#: A folder with this file beside its config has no weights on disk: vLLM loads it with the load format the file
#: names (harness.gpu.seeded_loader's seeded weights), e.g. Kimi-K2.5 at full depth, too large to write out.
SEEDED_MARKER = "harness-seeded.json"
#: Set to "1" (and inherited by vLLM's processes) where an engine loads a seeded folder: the loader registers itself
#: only then (harness.gpu.seeded_loader.register).
SEEDED_ENV = "HARNESS_SEEDED_LOADER"


def load_format_of(model_path: str | os.PathLike) -> str | None:
    """The load format a folder's SEEDED_MARKER names (and SEEDED_ENV set for the engine about to load it), or None
    for a checkpoint with weights on disk."""
    marker = Path(model_path) / SEEDED_MARKER
    if not marker.is_file():
        return None
    try:
        fmt = json.loads(marker.read_text()).get("load_format")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise HarnessInputError(f"{marker} is not a JSON object naming a load_format: {e}") from None
    if not isinstance(fmt, str) or not fmt:
        raise HarnessInputError(f"{marker} names no load_format")
    os.environ[SEEDED_ENV] = "1"  # the processes vLLM starts for this folder register the loader it names
    return fmt


def check_weights(model_path: str | os.PathLike) -> None:
    """A folder with a config but no weights fails only inside the worker, after ~30 s, as a generic start-up
    error whose cause is in the worker's log: refuse it here, in one line."""
    path = Path(model_path)
    if load_format_of(path):
        return
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise HarnessInputError(
            f"model path {str(path)!r} has a config.json but no weights "
            f"({', '.join(WEIGHT_PATTERNS)}): nothing for vLLM to load"
        )


def _is_int(x) -> bool:
    """A Python int (or a NumPy/torch integer scalar), never a bool, float or string that merely converts."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    return type(x).__module__ in ("numpy", "torch") and "int" in type(x).__name__.lower() and hasattr(x, "item")


def checked_layer_ids(layer_ids, num_layers: int) -> list[int] | None:
    """None (speculators' default choice) or a non-empty list of ints in [0, num_layers)."""
    if layer_ids is None:
        return None
    if isinstance(layer_ids, (str, bytes)) or not isinstance(layer_ids, (list, tuple)):
        raise HarnessInputError(f"layer ids must be a list of ints, got {type(layer_ids).__name__} {layer_ids!r}")
    if not layer_ids:
        raise HarnessInputError("layer ids: the list is empty; give at least one id, or None for speculators' choice")
    wrong_type = [x for x in layer_ids if not _is_int(x)]
    if wrong_type:
        raise HarnessInputError(
            f"layer ids must be ints, got {wrong_type[:5]!r} "
            f"({', '.join(sorted({type(x).__name__ for x in wrong_type}))})"
        )
    bad = [int(i) for i in layer_ids if not 0 <= int(i) < num_layers]
    if bad:
        raise HarnessInputError(
            f"layer ids {bad} out of range: the model has {num_layers} decoder layers (valid ids 0..{num_layers - 1})"
        )
    return [int(i) for i in layer_ids]


def text_config(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def checked_prompts(token_ids, vocab_size: int, max_model_len: int) -> list[list[int]]:
    """Only a batch of prompts, each a non-empty list of Python ints in the vocabulary, reaches vLLM: a
    float, bool, string or NaN is refused, never coerced (6.7 and True would silently become 6 and 1)."""
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, (list, tuple)):
        raise HarnessInputError(f"token ids must be a list of prompts (lists of ints), got {type(token_ids).__name__}")
    if not token_ids:
        raise HarnessInputError("empty batch: pass at least one prompt")
    return [_checked_prompt(i, p, vocab_size, max_model_len) for i, p in enumerate(token_ids)]


def _checked_prompt(i: int, p, vocab_size: int, max_model_len: int) -> list[int]:
    """Prompt `i` of a batch as a list of Python ints in the vocabulary, or HarnessInputError saying what it is."""
    if hasattr(p, "tolist"):
        p = p.tolist()
    if _is_int(p):
        raise HarnessInputError(
            "token ids must be a list of prompts (lists of ints), got a flat list of ints: wrap a single prompt as [ids]"
        )
    if isinstance(p, (str, bytes)) or not isinstance(p, (list, tuple)):
        raise HarnessInputError(f"prompt {i} must be a list of ints, got {type(p).__name__} {str(p)[:40]!r}")
    if not p:
        raise HarnessInputError(f"prompt {i} is empty")
    p = _plain_ints(i, list(p) if not isinstance(p, list) else p)
    if min(p) < 0 or max(p) >= vocab_size:
        bad = [t for t in p if not 0 <= t < vocab_size]
        raise HarnessInputError(f"prompt {i} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    if len(p) > max_model_len - 1:
        warnings.warn(
            f"prompt {i} has {len(p)} tokens; max_model_len={max_model_len} leaves room for "
            f"{max_model_len - 1}: it is truncated (as speculators does) and reported as truncated_from",
            TruncationWarning,
            stacklevel=4,  # the caller of generate(), two frames above checked_prompts
        )
    return p


def _plain_ints(i: int, p: list) -> list[int]:
    if all(type(t) is int for t in p):  # fast path for plain ints (a bool's type is not int)
        return p
    wrong = [t for t in p if not _is_int(t)]
    if wrong:
        raise HarnessInputError(
            f"prompt {i} has token ids that are not ints: {wrong[:5]!r} "
            f"({', '.join(sorted({type(t).__name__ for t in wrong}))})"
        )
    return [int(t) for t in p]
