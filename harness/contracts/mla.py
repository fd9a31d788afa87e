"""C-mla: the target's MLA attention (DeepSeek-V3, Kimi-K2.5) runs on this platform.

Not a speculators call, but a condition of running the Kimi-shaped fixture at all: CPU builds of
vLLM before 0.32 raise "MLA is not supported on CPU." when the attention backend is chosen, and
0.32's CPU MLA backend takes only kv_lora_rank + qk_rope_head_dim == 576, and 0.34's (AMX) only bfloat16
weights, where the suite runs its tiny models in float32. Where MLA cannot run, the
harness runs the model with `VLLM_MLA_DISABLE=1` (vLLM then expands MLA to plain multi-head
attention over the same weights) and the report says so; it is never hidden.

The probe asks the platform's own attention selector, in process, for an MLA backend with the
model's real head size (kv_lora_rank + qk_rope_head_dim); the shimmed attempt is the real executor
start with `VLLM_MLA_DISABLE=1`.
"""

from __future__ import annotations

import inspect
import os

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim, summarize
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import not_found

ENV = "VLLM_MLA_DISABLE"


def is_mla(text_config: dict) -> bool:
    return bool(text_config.get("kv_lora_rank"))


def apply_env() -> None:
    os.environ[ENV] = "1"


def _backend_enum(name: str | None):
    """The platform's enum member for a backend name (None: let the platform choose)."""
    if not name:
        return None
    import importlib

    for module in (
        "vllm.v1.attention.backends.registry",
        "vllm.attention.backends.registry",
        "vllm.platforms.interface",
    ):
        try:
            return importlib.import_module(module).AttentionBackendEnum[name]
        except (ImportError, AttributeError, KeyError):
            continue
    return None


def select_backend(
    head_size: int, dtype=None, use_mla: bool = False, backend: str | None = None, block_size: int = 16
) -> str:
    """Ask the installed platform which attention backend it would use; its class path, or what it raises.

    The selector's signature changed across versions (a NamedTuple of fields from 0.16); arguments are
    matched by name, and a NamedTuple parameter is built from the same values."""
    import torch
    from vllm.platforms import current_platform

    fn = current_platform.get_attn_backend_cls
    values = {
        "selected_backend": _backend_enum(backend),
        "head_size": int(head_size),
        "dtype": dtype or torch.bfloat16,
        "kv_cache_dtype": "auto",
        "block_size": block_size,
        "use_v1": True,
        "use_mla": use_mla,
        "has_sink": False,
        "use_sparse": False,
        "use_mm_prefix": False,
    }
    kwargs = {}
    for name, param in inspect.signature(fn).parameters.items():
        annotation = _resolve(fn, param.annotation)
        if name in values:
            kwargs[name] = values[name]
        elif hasattr(annotation, "_fields"):  # e.g. AttentionSelectorConfig (a NamedTuple)
            kwargs[name] = annotation(**{f: values[f] for f in annotation._fields if f in values})
        elif param.default is inspect.Parameter.empty:
            raise LookupError(f"cannot call {fn.__qualname__}{inspect.signature(fn)}: unknown parameter {name!r}")
    return str(fn(**kwargs))


SELECTOR_MODULES = ("vllm.v1.attention.selector", "vllm.attention.selector")


def _resolve(fn, annotation):
    """A string annotation (postponed evaluation) resolved to the class it names, where it can be found."""
    if not isinstance(annotation, str):
        return annotation
    import importlib
    import sys

    for module in (getattr(fn, "__module__", ""), *SELECTOR_MODULES):
        try:
            mod = sys.modules.get(module) or importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, annotation):
            return getattr(mod, annotation)
    return annotation


def select_mla_backend(text_config: dict, backend: str | None = None) -> str:
    """The platform's MLA backend for the model's latent head size (kv_lora_rank + qk_rope_head_dim)."""
    return select_backend(
        int(text_config["kv_lora_rank"]) + int(text_config["qk_rope_head_dim"]), use_mla=True, backend=backend
    )


def probe(
    subject: str,
    text_config: dict,
    started_with_env: bool,
    start_attempt: Attempt,
    backend: str | None = None,
    mla_start: Attempt | None = None,
) -> Observation:
    """`start_attempt`: the shared generator's start; `started_with_env`: whether it needed VLLM_MLA_DISABLE;
    `mla_start`: a start with MLA on that failed although the selector offered an MLA backend."""
    if not is_mla(text_config):
        return Observation(CONTRACT, Attempt(True), None, {}, not_applicable="model has no MLA", subject=subject)
    unshimmed, chosen = Attempt.run(lambda: select_mla_backend(text_config, backend))
    if unshimmed.ok and mla_start is not None and not mla_start.ok:
        unshimmed = Attempt.failed(
            "RuntimeError",
            f"the selector offers {chosen}, but the executor did not start with MLA on: {mla_start.text}",
        )
    facts = {
        "head_size": int(text_config["kv_lora_rank"]) + int(text_config["qk_rope_head_dim"]),
        "requested_backend": backend,
        "selected_backend": chosen,
        "ran_with_VLLM_MLA_DISABLE": started_with_env,
    }
    if unshimmed.ok and started_with_env:
        unshimmed = Attempt.failed("RuntimeError", "selector offers MLA, but the executor did not start with it")
    return Observation.of(CONTRACT, unshimmed, start_attempt, facts, subject=subject)


_PREPARED: dict[str, bool] = {}


def prepare(model, backend: str | None = None, options: dict | None = None) -> bool:
    """Before starting `model` here: ask the platform whether its MLA runs; if not, set VLLM_MLA_DISABLE.

    Returns whether MLA was disabled. Decided once per process and model (the variable is inherited
    by every executor started afterwards). `model`: its `name`, `path` and `text_config` (a tiny model, or a
    checkpoint `patched_generator` was given); `options`: the run options (as a dict of
    `harness.runtime.generator.Options` fields) a trial start in a child uses (default: the tiny model's own, in
    float32).
    """
    if model.name not in _PREPARED:
        disable = False
        if is_mla(model.text_config):
            chosen, _ = Attempt.run(lambda: select_mla_backend(model.text_config, backend))
            disable = CONTRACT.documented(chosen)
            if not disable and _on_cpu():
                # The selector offering MLA does not mean it runs (vLLM 0.28's CPU MLA picks a flash-attn
                # prefill it cannot import). A failed executor start leaves process state behind, so try
                # the start in a child interpreter.
                if options is None:
                    options = {**(getattr(model, "run_options", None) or {}), "dtype": "float32"}
                started = start_in_child(model.path, options)
                _CHILD_STARTS[model.name] = started
                disable = not started.ok
            if disable:
                apply_env()
        _PREPARED[model.name] = disable
    return _PREPARED[model.name]


_CHILD_STARTS: dict[str, Attempt] = {}


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.device_type == "cpu"


def start_in_child(model_path, options: dict) -> Attempt:
    """Start (and close) a generator for the checkpoint with MLA on, in a fresh interpreter."""
    import json
    import subprocess
    import sys

    code = (
        "import json; from harness.runtime.generator import HarnessGenerator, Options; "
        f"g = HarnessGenerator({str(model_path)!r}, [0], max_model_len=64, "
        f"options=Options(**json.loads({json.dumps(options)!r}))); g.close(); "
        "print('STARTED')"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV}
    proc = subprocess.run(
        [sys.executable, "-c", f"if __name__ == '__main__':\n    {code}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if "STARTED" in proc.stdout:
        return Attempt(True)
    tail = [line for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line]
    return Attempt.failed(
        "RuntimeError",
        "the executor did not start with MLA on: " + (summarize(tail[-1], 300) if tail else f"exit {proc.returncode}"),
    )


def start(model, start_fn, backend: str | None = None):
    """Start a generator for `model` (`start_fn`), disabling MLA where this platform cannot run it.

    Asks the platform first (`prepare`); where the selector offers MLA but the executor then fails to
    start (seen: vLLM 0.28's CPU MLA backend importing a CUDA-only helper), retries once with MLA
    disabled. Returns (generator or None, the start attempt that counts, MLA disabled?, failed MLA start).
    """
    disabled = prepare(model, backend)
    first, gen = Attempt.run(start_fn)
    if first.ok or disabled or not is_mla(model.text_config):
        return gen, first, disabled, _CHILD_STARTS.get(model.name) if disabled else None
    apply_env()
    _PREPARED[model.name] = True
    second, gen = Attempt.run(start_fn)
    return gen, second, True, first


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
CPU_PLATFORM = "vllm.platforms.cpu"
MLA_REJECTED = "MLA is not supported on"
ENVS = "vllm.envs"


def mla_platform(tree, used, follower) -> list[Fact]:
    env_lines = tree.string_lines(ENVS, ENV)
    envs = tree.module_file(ENVS)
    env_where = f"{envs.relative_to(tree.root)}:{env_lines[0]}" if env_lines else None
    facts = [
        Fact(
            CONTRACT.id,
            f"{ENVS}:{ENV}",
            "shim-dependency",
            "defined" if env_lines else "absent",
            bool(env_lines),
            "shim-dependency-missing",
            env_where,
        )
    ]
    rejects = tree.string_lines(CPU_PLATFORM, MLA_REJECTED)
    cpu = tree.module_file(CPU_PLATFORM)
    if cpu is None:
        return facts + [not_found(CONTRACT.id, f"{CPU_PLATFORM} (MLA)", "platform", "the CPU platform")]
    facts.append(
        Fact(
            CONTRACT.id,
            f"{CPU_PLATFORM} (MLA)",
            "platform",
            "rejects MLA" if rejects else "does not reject MLA",
            not rejects,
            "platform-rejects-mla",
            f"{cpu.relative_to(tree.root)}:{rejects[0] if rejects else 1}",
            detail={"env_defined": bool(env_lines)},
        )
    )
    return facts


CONTRACT = Contract(
    id="mla",
    assumes="MLA attention runs on this platform (no VLLM_MLA_DISABLE needed)",
    # vLLM 0.28's CPU MLA backend imports a flash-attn varlen helper from fa_utils that CPU builds lack.
    failures=(
        r"MLA is not supported on",
        r"MLA.*(not supported|unsupported)",
        r"cannot import name '\w*flash_attn\w*' from 'vllm\.v1\.attention\.backends\.fa_utils'",
        # vLLM 0.34's CPU MLA backend (AMX) takes bfloat16 weights only; the suite's tiny models run in float32.
        r"expect weight to be bfloat16",
    ),
    shims=(Shim(Attach.ENV, apply_env, note=f"{ENV}=1"),),
    gate_covers=(
        GateCover(
            "platform-rejects-mla",
            apply_env,
            "runs with VLLM_MLA_DISABLE=1: vLLM expands MLA to multi-head attention over the same weights",
            lambda f: bool(f.detail.get("env_defined")),
            "vllm.envs still defines VLLM_MLA_DISABLE",
        ),
    ),
    gate_checks=(mla_platform,),
    upstream=(
        "CPU builds before 0.32.0 have no MLA backend; 0.28.0's CPU MLA backend imports a flash-attn "
        "helper CPU builds lack; 0.34.0's CPU MLA backend is AMXMLABackend (vllm/v1/attention/backends/mla/"
        "amx_mla.py, supported_dtypes bfloat16 only)"
    ),
)
