"""C-blocksize: speculators' KV-cache block size (16) is one the platform's attention backend takes.

speculators hard-codes `VLLM_BLOCK_SIZE = 16`. vLLM 0.30's CPU attention backend declares kernel block
sizes that are multiples of 32 only (`get_supported_kernel_block_sizes() -> [MultipleOf(32)]`; MLA on CPU,
by contrast, needs exactly 16 and the platform sets it). vLLM's own judge of a block size is the backend's
`supports_block_size()` (what its `validate_configuration` reports as "block_size not supported").

Probe: ask the platform's selector for the model's backend with speculators' block size, then ask that
backend class, in vLLM's own words, whether it takes 16 (unshimmed) and whether it takes the block size the
shared generator actually ran with (shimmed). Whether the shim engaged is read off that generator's cache
config, not recomputed. A selector that raises is an observation (broken), never a silent "native".
Shim: where the backend does not take 16, use the smallest block size it does take, in speculators'
CacheConfig.
"""

from __future__ import annotations

import ast
import importlib
import re
from typing import Any

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import parse_file

SPECULATORS_BLOCK_SIZE = 16
CANDIDATES = (16, 32, 64, 128, 256)


def in_context(vllm_config):
    """Backends are asked inside the config's context: CUDA backends read the current config to declare their
    kernel block sizes (vLLM 0.20's FlashAttention does), so selection and `supports_block_size` need it."""
    from vllm.config import set_current_vllm_config

    return set_current_vllm_config(vllm_config)


def backend_class(vllm_config, block_size: int = SPECULATORS_BLOCK_SIZE):
    """The attention backend class the platform selects for this config's model at `block_size` (what it raises,
    raised). Call inside `in_context(vllm_config)`."""
    from harness.contracts.mla import select_backend

    mc = vllm_config.model_config
    path = select_backend(
        head_size=mc.get_head_size(), dtype=mc.dtype, use_mla=bool(getattr(mc, "use_mla", False)), block_size=block_size
    )
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def describe(sizes) -> list:
    """Kernel block sizes as text without memory addresses: 16, or 'MultipleOf(32)'."""
    return [s if isinstance(s, int) else f"{type(s).__name__}({getattr(s, 'base', '?')})" for s in sizes]


def check(backend, block_size: int) -> None:
    """vLLM's own verdict on a block size for this backend; raises in the words of validate_configuration.
    A vLLM whose backends have no `supports_block_size` has no kernel block-size constraint to meet."""
    judge = getattr(backend, "supports_block_size", None)
    if judge is not None and not judge(block_size):
        sizes = describe(getattr(backend, "get_supported_kernel_block_sizes", list)())
        raise ValueError(f"{backend.__name__}: block_size not supported: {block_size} (kernel block sizes {sizes})")


def accepted(backend, at_least: int) -> int:
    """The smallest candidate block size >= at_least that the backend takes."""
    for size in CANDIDATES:
        if size >= at_least and getattr(backend, "supports_block_size", lambda _: True)(size):
            return size
    raise ValueError(f"{backend.__name__} takes none of the block sizes {CANDIDATES}")


def apply(ns: dict, current, state=None) -> None:
    """Wraps VllmConfig: build it, ask its backend (in its context) whether it takes speculators' block size;
    where not, move the block size in speculators' CacheConfig to one it takes and build the config again,
    so that everything derived from the block size follows."""
    real = current("VllmConfig")

    def VllmConfig(**kwargs):  # noqa: N802
        cfg = real(**kwargs)
        cc, mc = kwargs.get("cache_config"), cfg.model_config
        if cc is None or mc is None or getattr(mc, "use_mla", False):
            return cfg
        with in_context(cfg):
            size = accepted(backend_class(cfg, cc.block_size), cc.block_size)
        if size == cc.block_size:
            return cfg
        cc.block_size = size
        return real(**kwargs)

    ns["VllmConfig"] = VllmConfig


def probe(ctx) -> Observation:
    mc = ctx.vllm_config.model_config
    if getattr(mc, "use_mla", False):
        return Observation(
            CONTRACT, Attempt(True), None, {}, not_applicable="MLA models: the platform sets the block size"
        )
    used = int(ctx.vllm_config.cache_config.block_size)
    facts: dict[str, Any] = {"block_size_used": used, "shim_selected": used != SPECULATORS_BLOCK_SIZE}
    with in_context(ctx.vllm_config):
        selected, backend = Attempt.run(lambda: backend_class(ctx.vllm_config))
        facts["backend"] = f"{backend.__module__}.{backend.__name__}" if backend else None
        facts["vllm_judges_block_sizes"] = bool(backend is not None and hasattr(backend, "supports_block_size"))
        if not selected.ok:
            return Observation(CONTRACT, selected, None, facts)
        facts["kernel_block_sizes"] = describe(getattr(backend, "get_supported_kernel_block_sizes", list)())
        unshimmed, _ = Attempt.run(lambda: check(backend, SPECULATORS_BLOCK_SIZE))
        shimmed = None
        if not unshimmed.ok:
            shimmed, _ = Attempt.run(lambda: check(backend, used))
    return Observation(CONTRACT, unshimmed, shimmed, facts)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
CPU_ATTENTION = ("vllm.v1.attention.backends.cpu_attn", "get_supported_kernel_block_sizes")


def cpu_kernel_block_sizes(tree, used, follower) -> list[Fact]:
    module, method = CPU_ATTENTION
    f = tree.module_file(module)
    if f is None:
        return [Fact(CONTRACT.id, f"{module}:{method}", "block-size", "no CPU attention backend", True)]
    node = next((n for n in ast.walk(parse_file(f)) if isinstance(n, ast.FunctionDef) and n.name == method), None)
    if node is None:
        return [
            Fact(
                CONTRACT.id,
                f"{module}:{method}",
                "block-size",
                "declares none",
                True,
                None,
                f"{f.relative_to(tree.root)}:1",
            )
        ]
    ret = next((n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None), None)
    text = ast.unparse(ret) if ret is not None else "?"
    ints = [int(x) for x in re.findall(r"(?<![\w(])(\d+)(?![\w)])", text)]
    multiples = [int(x) for x in re.findall(r"MultipleOf\((\d+)\)", text)]
    takes_16 = SPECULATORS_BLOCK_SIZE in ints or any(SPECULATORS_BLOCK_SIZE % m == 0 for m in multiples)
    return [
        Fact(
            CONTRACT.id,
            f"{module}:{method}",
            "block-size",
            text,
            takes_16,
            "block-size-unsupported",
            f"{f.relative_to(tree.root)}:{node.lineno}",
            detail={"declared": text},
        )
    ]


CONTRACT = Contract(
    id="blocksize",
    assumes="block_size=16 is a KV-cache block size the attention backend supports",
    # The probe's words (vLLM's own validate_configuration) and the run's (0.32's model runner:
    # "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])", seen by the shim proof).
    failures=(r"block_size not supported", r"No common block size for \d+"),
    shims=(Shim(Attach.GENERATOR, apply),),
    gate_covers=(
        GateCover(
            "block-size-unsupported",
            apply,
            "moves speculators' block size to the smallest one the attention backend declares",
        ),
    ),
    gate_checks=(cpu_kernel_block_sizes,),
    upstream=(
        "vLLM 0.30.0's CPU attention declares kernel block sizes MultipleOf(32) (first seen in the CPU "
        "matrix at 0.30.0)"
    ),
)
