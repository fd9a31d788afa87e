"""The GPU tier's library: configuration, the facts it reports, hidden-state fingerprints and drift.

`suites/gpu/` drives it under pytest (`-m gpu`); `python -m harness gpu-nightly` runs that suite
with a dated report and compares the fingerprints with the previous night's. Everything here that
does not touch CUDA also runs on CPU (the fingerprint and drift logic are unit-tested there).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.support.paths import FIXTURES, REPORTS

DEFAULT_TP = 8
DEFAULT_PROMPTS = FIXTURES / "prompts" / "gpu-prompts.json"
GPU_REPORTS = REPORTS / "gpu"
#: Stated tolerances for a prompt alone vs in a batch, and run to run when not bitwise: max abs difference up to
#: TOLERANCE, or up to REL_TOLERANCE x the largest |value| compared, whichever is larger (`bound`). vLLM does not
#: promise batch-invariant kernels: a different batch shape can change a GEMM's blocking, so the same row may
#: differ by a few units in the last place, and those grow with the states' magnitude. An absolute bound fitted
#: the tiny models (|values| ~1-3) and failed a random 1.4B Llama on the H200 (0.109 at |values| up to 5.9, ~3.5
#: bf16 units in the last place; reports/gpu/2026-12-03-bench-llama1b4-*). bf16 keeps 8 significant bits: 2^-5
#: is 4-8 units in the last place. Rows of another prompt differ by the states' spread (~0.9 there): far above.
#: The tier check that a prompt alone gives its states in a batch (named in reports; the matrix reads it back).
ALONE_CHECK = "each prompt alone == inside the batch"
TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-2, "float16": 1e-2}
REL_TOLERANCE = {"float32": 1e-5, "bfloat16": 2**-5, "float16": 2**-8}


def bound(dtype: str, tensors) -> float:
    """The tolerance for differences between these tensors and others of the same prompts (see TOLERANCE)."""
    absmax = max((float(t.float().abs().max()) for t in tensors if t.numel()), default=0.0)
    return max(TOLERANCE[dtype], REL_TOLERANCE[dtype] * absmax)


#: Reasons a requested GPU test may skip; any other skip of a requested run is a failure.
ALLOWED_SKIPS = (
    "no CUDA device",
    "fewer GPUs than tensor_parallel_size",
    "model path",
    "dry run on CPU",
    "throughput not asked for",
)


@dataclass
class TierConfig:
    model_path: str | None
    tp: int = DEFAULT_TP
    layer_ids: list[int] | None = None  # None: speculators 0.3.0's own choice
    dtype: str = "bfloat16"
    prompts_file: str = str(DEFAULT_PROMPTS)
    report_dir: str = str(GPU_REPORTS)
    attention_backend: str | None = None  # None: vLLM's default for the model
    gpu_memory_utilization: float = 0.8  # speculators' default
    max_model_len: int = 2048
    allow_cpu: bool = False  # dry runs of the tier's code on a CPU build (never the default)
    throughput_pairs: int = 5  # extraction against plain prefill, this many timed calls a side (0: not measured)

    @classmethod
    def from_env(cls, **given) -> TierConfig:
        env = os.environ.get
        values: dict[str, Any] = {
            "model_path": env("HARNESS_GPU_MODEL_PATH"),
            "tp": int(env("HARNESS_GPU_TP", DEFAULT_TP)),
            "layer_ids": [int(x) for x in env("HARNESS_GPU_LAYER_IDS", "").split(",") if x.strip()] or None,
            "dtype": env("HARNESS_GPU_DTYPE", "bfloat16"),
            "prompts_file": env("HARNESS_GPU_PROMPTS", str(DEFAULT_PROMPTS)),
            "report_dir": env("HARNESS_GPU_REPORT_DIR", str(GPU_REPORTS)),
            "attention_backend": env("HARNESS_GPU_ATTENTION_BACKEND") or None,
            "gpu_memory_utilization": float(env("HARNESS_GPU_MEMORY_UTILIZATION", "0.8")),
            "max_model_len": int(env("HARNESS_GPU_MAX_MODEL_LEN", "2048")),
            "allow_cpu": env("HARNESS_GPU_DRY_RUN_ON_CPU") == "1",
            "throughput_pairs": int(env("HARNESS_GPU_THROUGHPUT_PAIRS", "5")),
        }
        values.update({k: v for k, v in given.items() if v is not None})
        return cls(**values)


def skip_reason(cfg: TierConfig) -> str | None:
    """Why this machine cannot run the tier as configured (None: it can)."""
    if not cfg.model_path:
        return "model path not given (--model-path or HARNESS_GPU_MODEL_PATH)"
    if not (Path(cfg.model_path) / "config.json").is_file():
        return f"model path {cfg.model_path} does not exist or has no config.json"
    if cfg.allow_cpu:
        return None
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device on this machine"
    have = torch.cuda.device_count()
    if have < cfg.tp:
        return f"fewer GPUs than tensor_parallel_size: needs {cfg.tp}, this machine has {have}"
    return None


def load_prompts(path: str | Path, tokenizer) -> list[list[int]]:
    texts = json.loads(Path(path).read_text())["prompts"]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] or [tokenizer.eos_token_id] for t in texts]


# -- facts about the machine -----------------------------------------------------------------------
def device_info() -> dict:
    import torch

    info = {"cuda_available": torch.cuda.is_available(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["device_count"] = torch.cuda.device_count()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode == 0:
            info["nvidia_smi"] = [line.strip() for line in out.stdout.strip().splitlines()]
    except (OSError, subprocess.TimeoutExpired):
        info["nvidia_smi"] = None
    return info


def gpu_processes() -> list[int]:
    """PIDs nvidia-smi lists as using a GPU (may be empty in containers that hide PIDs)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in out.stdout.split() if x.strip().isdigit()]


# -- fingerprints and drift ------------------------------------------------------------------------
def fingerprint(results: list[dict], layer_ids: list[int]) -> dict:
    """Per requested layer: a hash of the bytes of every row (prompt order) and summary statistics."""
    import torch

    out = {}
    for i, layer in enumerate(layer_ids):
        stacked = torch.cat([r["hidden_states"][i].contiguous() for r in results], dim=0)
        as_f32 = stacked.float()
        digest = hashlib.sha256(stacked.cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
        out[str(layer)] = {
            "sha256": digest,
            "dtype": str(stacked.dtype).replace("torch.", ""),
            "rows": int(stacked.shape[0]),
            "mean": float(as_f32.mean()),
            "std": float(as_f32.std()),
            "min": float(as_f32.min()),
            "max": float(as_f32.max()),
            "absmax": float(as_f32.abs().max()),
        }
    return out


#: Drift outcomes: compared and equal, compared and different, or nothing to compare with (never "none").
NO_DRIFT, DRIFT, NO_BASELINE = "none", "drift", "no baseline"


@dataclass
class Drift:
    compared_with: str | None
    drifted: bool = False
    changes: list[str] = field(default_factory=list)
    outcome: str = NO_DRIFT


def compare(previous: dict | None, current: dict, previous_name: str | None = None, rel_tol: float = 1e-3) -> Drift:
    """Bitwise drift (hash) and statistical drift (mean/std/absmax beyond rel_tol) per layer."""
    if not previous:
        return Drift(
            None, False, ["no earlier report of the same run (model, weights, TP, dtype, prompts, layers)"], NO_BASELINE
        )
    d = Drift(previous_name)
    for layer, cur in current.items():
        old = previous.get(layer)
        if old is None:
            d.changes.append(f"layer {layer}: not in the previous report")
            d.drifted = True
            continue
        if old["sha256"] != cur["sha256"]:
            d.drifted = True
            stats = [
                f"{k} {old[k]:.6g} -> {cur[k]:.6g}"
                for k in ("mean", "std", "absmax")
                if abs(cur[k] - old[k]) > rel_tol * max(abs(old[k]), 1e-12)
            ]
            d.changes.append(
                f"layer {layer}: bytes differ"
                + (f"; {', '.join(stats)}" if stats else " (statistics within tolerance)")
            )
    d.outcome = DRIFT if d.drifted else NO_DRIFT
    return d


#: Checkpoints larger than this are identified by each file's size, safetensors header and sampled blocks
#: (hashing a 1T-parameter checkpoint every night is not an option); smaller ones by every byte.
FULL_HASH_LIMIT = 2 * 2**30
SAMPLE = 2**20


def weights_identity(model_path: str | Path) -> dict:
    """What identifies a checkpoint's weights, independent of the folder's name or location. A folder without
    weights on disk (harness.runtime.inputs.SEEDED_MARKER) is identified by its marker and the seeding code."""
    from harness.runtime.inputs import SEEDED_MARKER

    marker = Path(model_path) / SEEDED_MARKER
    if marker.is_file():
        import inspect

        from harness.gpu import seeded_loader

        seeding = (seeded_loader.centred_int4, seeded_loader.seed_weights)
        code = (
            f"{seeded_loader.LOAD_FORMAT} {seeded_loader.WEIGHT_STD} {seeded_loader.INT4_CODE_STD}\n"
            + "".join(inspect.getsource(f) for f in seeding)
        ).encode()
        h = hashlib.sha256(marker.read_bytes() + code)
        return {
            "sha256": h.hexdigest(),
            "method": f"no files: {SEEDED_MARKER} and the seeding code (seed_weights)",
            "files": 0,
            "bytes": 0,
        }
    files = sorted(Path(model_path).glob("*.safetensors")) or sorted(Path(model_path).glob("*.bin"))
    total = sum(f.stat().st_size for f in files)
    full = total <= FULL_HASH_LIMIT
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}\n".encode())
        with open(f, "rb") as fh:
            if full:
                for block in iter(lambda: fh.read(1 << 24), b""):
                    h.update(block)
                continue
            head = fh.read(8)
            header_len = int.from_bytes(head, "little") if f.suffix == ".safetensors" else 0
            h.update(head + fh.read(min(header_len, 100 * 2**20)))
            for offset in (size // 2, max(size - SAMPLE, 0)):
                fh.seek(offset)
                h.update(fh.read(SAMPLE))
    return {
        "sha256": h.hexdigest(),
        "method": "every byte" if full else "sizes, safetensors headers, sampled blocks",
        "files": len(files),
        "bytes": total,
    }


def run_key(model_path: str | Path, tp: int, dtype: str, prompts: list[list[int]], layer_ids: list[int]) -> dict:
    """The identity of a nightly run: the drift baseline is the newest earlier report with the same key."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    parts: dict[str, Any] = {
        "config_sha256": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
        "weights": weights_identity(model_path),
        "tp": int(tp),
        "dtype": dtype,
        "prompts_sha256": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        "layer_ids": [int(i) for i in layer_ids],
    }
    key = {k: v for k, v in parts.items() if k != "weights"} | {"weights_sha256": parts["weights"]["sha256"]}
    return {"key": hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest(), **parts}


def baseline(
    directory: Path | list[Path], key: str, before: str, exclude: Path | None = None
) -> tuple[str, dict] | None:
    """The newest report whose run key is `key` in `directory` (or any of several: the run's report folder and the
    committed reports/gpu, so that a fresh checkout's nightly finds the baseline it was given), dated before
    `before` (YYYY-MM-DD), or on that date when it is not `exclude` (the file this run writes)."""
    folders = [Path(d) for d in (directory if isinstance(directory, list) else [directory])]
    skip = Path(exclude).resolve() if exclude else None
    found = []
    for p in (f for d in dict.fromkeys(x.resolve() for x in folders) for f in sorted(d.glob("*.json"))):
        if p.name[:10] > before or (p.name[:10] == before and (skip is None or p == skip)):
            continue
        try:
            rep = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if (rep.get("run_key") or {}).get("key") == key:
            found.append((p.name, rep))
    return max(found, key=lambda item: item[0]) if found else None


def report_name(model_name: str, tp: int, dtype: str) -> str:
    return f"{model_name}-tp{tp}-{dtype}"


def today() -> str:
    return _dt.date.today().isoformat()


def asdict_config(cfg: TierConfig) -> dict:
    """The config as the report records it: the model path, prompts file and report dir relative to the repo
    when inside it, else only their last part (a machine's absolute paths say nothing to the next reader)."""
    from harness.contracts.base import short_path

    def shown(path) -> str | None:
        if path is None:
            return None
        short = short_path(str(path))
        return f"<outside the repo>/{Path(short).name}" if short.startswith("/") else short

    out = asdict(cfg)
    out["model_path"] = shown(cfg.model_path)
    out["prompts_file"] = shown(cfg.prompts_file)
    out["report_dir"] = shown(cfg.report_dir)
    return out


def loaded_model(worker):
    """(Runs on a worker.) The model it has loaded: its runner's `get_model()` where it has one, else `.model`."""
    runner = worker.model_runner
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


def moe_methods(worker) -> dict:
    """(Runs on a worker.) Per quantization-method class of the loaded model's MoE layers: how many layers use it and
    its kernel-choosing attributes (names with kernel/backend/marlin/experts; objects by their class name)."""
    model = loaded_model(worker)
    found: dict = {}
    for module in model.modules():
        qm = getattr(module, "quant_method", None)
        if qm is None or not hasattr(module, "moe_config"):
            continue
        entry = found.setdefault(type(qm).__name__, {"layers": 0, "attributes": {}})
        entry["layers"] += 1
        for k, v in vars(qm).items():
            if not any(s in k.lower() for s in ("kernel", "backend", "marlin", "experts")):
                continue
            entry["attributes"][k] = (
                v
                if isinstance(v, (str, bool, int, float)) or v is None
                else (str(v) if hasattr(v, "name") and not callable(v) else type(v).__name__)
            )
    return found


def moe_methods_of(generator) -> dict:
    """`moe_methods` of rank 0's model, or {"error": ...} where the worker could not say."""
    try:
        return generator.real_executor.collective_rpc("_harness_call", args=(moe_methods,))[0]
    except Exception as e:  # noqa: BLE001 - recorded in the report, never fatal to the tier
        return {"error": f"{type(e).__name__}: {e}"[:300]}
