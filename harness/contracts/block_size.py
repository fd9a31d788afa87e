"""C-blocksize: speculators' KV-cache block size (16) is one the platform's attention kernels take.

speculators hard-codes `VLLM_BLOCK_SIZE = 16`. vLLM 0.32's CPU attention backend declares kernel block
sizes that are multiples of 32 only (MLA on CPU, by contrast, needs exactly 16 and the platform sets
it). Shim: ask the attention backend the platform selects for the model which kernel block sizes it
takes; where 16 is not one of them, use the smallest one that is, in speculators' CacheConfig.
"""

from __future__ import annotations

import importlib

from harness.contracts.base import Attempt, Contract, Observation

CONTRACT = Contract(
    id="blocksize",
    assumes="block_size=16 is a KV-cache block size the attention backend supports",
    failures=(r"block.size", r"[Bb]lock size"),
    shim="harness.contracts.block_size.apply",
)

SPECULATORS_BLOCK_SIZE = 16


def kernel_block_sizes(model_config) -> list | None:
    """What the platform's attention backend for this model declares (None: nothing declared)."""
    from harness.contracts.mla import select_backend

    try:
        path = select_backend(head_size=model_config.get_head_size(), dtype=model_config.dtype,
                              use_mla=bool(getattr(model_config, "use_mla", False)))
    except Exception:  # noqa: BLE001 - a platform that cannot answer declares nothing
        return None
    module, _, name = path.rpartition(".")
    backend = getattr(importlib.import_module(module), name, None)
    fn = getattr(backend, "get_supported_kernel_block_sizes", None)
    return list(fn()) if callable(fn) else None


def accepts(sizes: list | None, block: int) -> bool:
    if not sizes:
        return True
    return any((s == block) if isinstance(s, int) else block % getattr(s, "base", 1) == 0 for s in sizes)


def smallest_accepted(sizes: list, at_least: int) -> int:
    ints = sorted(s for s in sizes if isinstance(s, int) and s >= at_least)
    bases = sorted(getattr(s, "base") for s in sizes if not isinstance(s, int))
    candidates = ints + [b * -(-at_least // b) for b in bases]
    return min(candidates)


def apply(ns: dict, current, state=None) -> None:
    """Wraps VllmConfig: before it is built, move speculators' block size to one the backend takes."""
    real = current("VllmConfig")

    def VllmConfig(**kwargs):  # noqa: N802
        cc, mc = kwargs.get("cache_config"), kwargs.get("model_config")
        if cc is not None and mc is not None and not getattr(mc, "use_mla", False):
            sizes = kernel_block_sizes(mc)
            if not accepts(sizes, cc.block_size):
                cc.block_size = smallest_accepted(sizes, cc.block_size)
        return real(**kwargs)

    ns["VllmConfig"] = VllmConfig


def probe(ctx) -> Observation:
    mc = ctx.vllm_config.model_config
    if getattr(mc, "use_mla", False):
        return Observation(CONTRACT, Attempt(True), None, {}, not_applicable="MLA models: the platform sets the block size")
    sizes = kernel_block_sizes(mc)
    facts = {"kernel_block_sizes": [repr(s) for s in sizes] if sizes else None,
             "block_size_used": int(ctx.vllm_config.cache_config.block_size), "shim_selected": not accepts(sizes, 16)}
    unshimmed = (Attempt(True) if accepts(sizes, SPECULATORS_BLOCK_SIZE) else
                 Attempt.failed("ValueError", f"the attention backend takes block sizes {facts['kernel_block_sizes']}, "
                                f"not speculators' {SPECULATORS_BLOCK_SIZE}"))
    shimmed = Attempt(True) if accepts(sizes, facts["block_size_used"]) else Attempt.failed(
        "ValueError", f"block size {facts['block_size_used']} still not accepted")
    return Observation(CONTRACT, unshimmed, None if unshimmed.ok else shimmed, facts)
