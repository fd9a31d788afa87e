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

import importlib

from harness.contracts.base import Attempt, Contract, Observation

CONTRACT = Contract(
    id="blocksize",
    assumes="block_size=16 is a KV-cache block size the attention backend supports",
    failures=(r"block_size not supported",),
    shim="harness.contracts.block_size.apply",
)

SPECULATORS_BLOCK_SIZE = 16
CANDIDATES = (16, 32, 64, 128, 256)


def backend_class(model_config, block_size: int = SPECULATORS_BLOCK_SIZE):
    """The attention backend class the platform selects for this model at `block_size` (what it raises, raised)."""
    from harness.contracts.mla import select_backend

    path = select_backend(head_size=model_config.get_head_size(), dtype=model_config.dtype,
                          use_mla=bool(getattr(model_config, "use_mla", False)), block_size=block_size)
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
        raise ValueError(f"{backend.__name__}: block_size not supported: {block_size} "
                         f"(kernel block sizes {sizes})")


def accepted(backend, at_least: int) -> int:
    """The smallest candidate block size >= at_least that the backend takes."""
    for size in CANDIDATES:
        if size >= at_least and getattr(backend, "supports_block_size", lambda _: True)(size):
            return size
    raise ValueError(f"{backend.__name__} takes none of the block sizes {CANDIDATES}")


def apply(ns: dict, current, state=None) -> None:
    """Wraps VllmConfig: before it is built, move speculators' block size to one the backend takes."""
    real = current("VllmConfig")

    def VllmConfig(**kwargs):  # noqa: N802
        cc, mc = kwargs.get("cache_config"), kwargs.get("model_config")
        if cc is not None and mc is not None and not getattr(mc, "use_mla", False):
            cc.block_size = accepted(backend_class(mc, cc.block_size), cc.block_size)
        return real(**kwargs)

    ns["VllmConfig"] = VllmConfig


def probe(ctx) -> Observation:
    mc = ctx.vllm_config.model_config
    if getattr(mc, "use_mla", False):
        return Observation(CONTRACT, Attempt(True), None, {}, not_applicable="MLA models: the platform sets the block size")
    used = int(ctx.vllm_config.cache_config.block_size)
    selected, backend = Attempt.run(lambda: backend_class(mc))
    facts = {"block_size_used": used, "shim_selected": used != SPECULATORS_BLOCK_SIZE,
             "backend": f"{backend.__module__}.{backend.__name__}" if backend else None,
             "vllm_judges_block_sizes": bool(backend is not None and hasattr(backend, "supports_block_size"))}
    if not selected.ok:
        return Observation(CONTRACT, selected, None, facts)
    facts["kernel_block_sizes"] = describe(getattr(backend, "get_supported_kernel_block_sizes", list)())
    unshimmed, _ = Attempt.run(lambda: check(backend, SPECULATORS_BLOCK_SIZE))
    shimmed = None
    if not unshimmed.ok:
        shimmed, _ = Attempt.run(lambda: check(backend, used))
    return Observation(CONTRACT, unshimmed, shimmed, facts)
