"""Tiny checkpoints, generated offline and deterministically from `fixtures/models/*.json`.

Nothing is downloaded, and no architecture is written out here: a fixture file is the whole description of
a model. transformers enumerates the weights (the architecture built from the fixture's config on the meta
device, mapped back to the layout transformers saves: per-expert MoE weights, as DeepSeek-V3 and Kimi-K2.5
ship them), and every weight is drawn from its own seeded generator (seed = the fixture's seed + CRC32 of the
tensor name), so the values depend only on the fixture: not on the installed transformers, not on the order
tensors are created in. A built checkpoint is loaded back in transformers and refused if any key is missing
or unexpected, so a fixture cannot produce a checkpoint vLLM would half-initialise.

Checkpoints are cached under `cache_dir()` keyed by a hash of the fixture and of this generator's
version; a build goes to a temporary folder that is renamed into place, so an interrupted build
never leaves a half-written model behind.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from harness.support.paths import CACHE, FIXTURES

MODELS_FIXTURES = FIXTURES / "models"
#: Bump when the weight layout or the init rule changes: it is part of the cache key.
GENERATOR_VERSION = 9


@dataclass(frozen=True)
class TinyModel:
    name: str
    path: Path
    hf_config: dict
    fingerprint: str
    run_options: dict | None = (
        None  # harness.runtime.generator.Options fields this model needs (e.g. language_model_only)
    )
    #: Layer ids the suites' shared generator captures (the fixture's `probe_layers`, else last, first, middle:
    #: unordered on purpose, both ends included).
    probe_layers: tuple = ()
    #: What the per-model contract rows are keyed by: the fixture's name (two fixtures of one architecture keep
    #: their own rows); the GPU tier, which runs any checkpoint by path, keys by the checkpoint's model_type.
    row_key: str = ""

    @property
    def subject(self) -> str:
        return self.row_key or self.name

    @property
    def family(self) -> str:
        """The checkpoint's architecture family (its config's model_type)."""
        return self.hf_config.get("model_type", "")

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

    def absent_from_vllm(self) -> str | None:
        """Why the installed vLLM cannot run this model at all (its architecture is not registered yet), or None.
        Rows of such a model are n/a, never broken: 0.11-0.14 predate Kimi-K2.5's wrapper, for example."""
        from vllm.model_executor.models import ModelRegistry

        if self.architecture in ModelRegistry.get_supported_archs():
            return None
        return f"{self.architecture} is not in this vLLM's model registry"


def cache_dir() -> Path:
    """Where generated checkpoints live (`HARNESS_CACHE_DIR`, else `<repo>/.cache/models`)."""
    return Path(os.environ.get("HARNESS_CACHE_DIR", CACHE / "models"))


def fixture_names() -> list[str]:
    return sorted(p.stem for p in MODELS_FIXTURES.glob("*.json"))


#: Fixtures the suites do not iterate over, used by name only: sized for a run that the suite's models do not fit
#: (tensor parallelism up to 8 ranks).
BY_NAME_ONLY = MODELS_FIXTURES / "tp"


def load_fixture(name: str) -> dict:
    path = MODELS_FIXTURES / f"{name}.json"
    if not path.is_file() and (BY_NAME_ONLY / f"{name}.json").is_file():
        path = BY_NAME_ONLY / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no tiny-model fixture {name!r} in {MODELS_FIXTURES} (have: {', '.join(fixture_names())})"
        )
    return json.loads(path.read_text())


def _fixture_key(fixture: dict) -> str:
    blob = json.dumps(fixture, sort_keys=True).encode() + f"gen{GENERATOR_VERSION}".encode()
    blob += b"".join(f.name.encode() + f.read_bytes() for f in fixture_files(fixture))
    return hashlib.sha256(blob).hexdigest()[:12]


def weights_spec(fixture: dict) -> dict:
    """Which model the checkpoint's weights are the weights of: the fixture's whole `hf_config` by default; a
    fixture's `weights_from` names a sub-config (`config_key`), the transformers `model_type` to build it as and
    the `prefix` its names carry (Kimi-K2.5: the DeepseekV3 text model under `language_model.`, text only)."""
    spec = dict(fixture.get("weights_from") or {})
    cfg = fixture["hf_config"]
    sub = cfg[spec["config_key"]] if spec.get("config_key") else cfg
    return {
        "config": sub,
        "model_type": spec.get("model_type") or sub["model_type"],
        "prefix": spec.get("prefix", ""),
        "config_key": spec.get("config_key"),
    }


def _kind(name: str, shape: tuple[int, ...], embeddings: set[str]) -> str:
    if name in embeddings:
        return "embed"
    if len(shape) == 1:
        return "norm" if name.endswith(".weight") else "bias"  # a 1-D weight scales (norms); others shift
    return "linear"


def weight_layout(fixture: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every tensor of the fixture's checkpoint, as transformers enumerates them.

    The architecture is instantiated from the fixture's config on the meta device (no memory, no values); its
    state dict is mapped back to the checkpoint layout transformers itself saves (per-expert MoE weights where a
    transformers version fuses experts in memory), so the names do not depend on the installed transformers.
    Parameters tied to another one (tied embeddings) are left out, as save_pretrained leaves them out."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = weights_spec(fixture)
    kwargs = {k: v for k, v in spec["config"].items() if k not in ("model_type", "auto_map")}
    config = AutoConfig.for_model(spec["model_type"], **kwargs)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = model.state_dict()
    kept = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers() if n in state}
    state = {n: t for n, t in state.items() if n in kept}
    try:  # transformers >= 5 fuses some weights in memory; this is how it writes them back
        from transformers.core_model_loading import revert_weight_conversion

        state = revert_weight_conversion(model, state)
    except ImportError:
        pass
    embeddings = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)}
    prefix = spec["prefix"]
    return sorted((prefix + n, tuple(t.shape), _kind(n, tuple(t.shape), embeddings)) for n, t in state.items())


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


#: What tiny-Kimi's stand-in image processor (fixtures/models/tiny-kimi-k25.files) raises when asked about media;
#: harness.reporting.attribution recognises it as the fixture's refusal, not a vLLM breakage.
TEXT_ONLY_REFUSAL = "tiny-Kimi is a text-only checkpoint: it has no vision weights"


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
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        **special,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (dest / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


def _draw_all(layout, seed: int, store_dtype: str | None = None) -> dict:
    """Every tensor of `layout`, drawn in parallel threads: each has its own seeded generator, so the values
    do not depend on the threading (a benchmark-sized checkpoint of ~10^10 parameters then builds in
    seconds, not minutes). `store_dtype` (a fixture key, e.g. "bfloat16" for the GPU benchmark shapes)
    stores the drawn float32 values rounded to that dtype: half the disk and load time."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    def one(item):
        name, shape, kind = item
        t = _draw(name, shape, kind, seed).contiguous()
        return name, (t.to(getattr(torch, store_dtype)) if store_dtype else t)

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        return dict(pool.map(one, layout))


def fixture_files(fixture: dict) -> list[Path]:
    """The files a fixture ships beside its config (`"files": "<folder under fixtures/models>"`), copied into the
    checkpoint as they are: e.g. the remote-code config class and processor a Kimi-K2.5 checkpoint carries."""
    folder = fixture.get("files")
    return sorted(p for p in (MODELS_FIXTURES / folder).iterdir() if p.is_file()) if folder else []


def write_config_folder(dest: Path, fixture: dict) -> None:
    """Everything of a checkpoint folder but its weights: config.json, generation_config.json, the tokenizer and the
    files the fixture ships (a folder with no weights is loaded by harness.gpu.seeded_loader)."""
    cfg = copy.deepcopy(fixture["hf_config"])
    (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    text = cfg.get("text_config", cfg)
    gen = {"bos_token_id": text.get("bos_token_id", 1), "eos_token_id": text.get("eos_token_id", 2)}
    (dest / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    _write_tokenizer(dest, int(text.get("max_position_embeddings", 2048)))
    for f in fixture_files(fixture):
        shutil.copyfile(f, dest / f.name)


def _build_into(dest: Path, fixture: dict, layout: list) -> str:
    import torch
    from safetensors.torch import save_file

    tensors = _draw_all(layout, fixture["seed"], fixture.get("store_dtype"))
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    write_config_folder(dest, fixture)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].reshape(-1).view(torch.uint8).numpy())  # the tensor's bytes, as stored
    del torch
    return digest.hexdigest()


#: Checkpoints up to this many parameters are loaded back in transformers when built (tiny ones: under a
#: second); the GPU benchmark shapes (10^9-10^10) are not, their layout is the same code's.
VERIFY_LOAD_MAX_PARAMS = 50_000_000


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
            layout = weight_layout(fixture)
            fp = _build_into(tmp, fixture, layout)
            weights = {k: v for k, v in weights_spec(fixture).items() if k != "config"}
            meta = {"fixture": name, "fingerprint": fp, "generator": GENERATOR_VERSION, "weights": weights}
            (tmp / "harness-model.json").write_text(json.dumps(meta, indent=2) + "\n")
            if sum(math.prod(shape) for _, shape, _ in layout) <= VERIFY_LOAD_MAX_PARAMS:
                from harness.subjects import reference

                reference.check_loads(tmp)  # refuses a checkpoint transformers would load with missing keys
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
    n = int(weights_spec(fixture)["config"]["num_hidden_layers"])
    return TinyModel(
        name,
        final,
        fixture["hf_config"],
        meta["fingerprint"],
        dict(fixture.get("run_options", {})),
        tuple(fixture.get("probe_layers") or (n - 1, 0, n // 2)),
    )
