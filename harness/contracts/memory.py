"""C-memory: `torch.cuda.mem_get_info()` gives the free memory speculators sizes the KV cache from.

On a machine without CUDA (vLLM's CPU build) the call raises. Shim: a platform-neutral budget:
CUDA's free memory where CUDA is the platform, else the KV-cache space the CPU platform reserves
(`VLLM_CPU_KVCACHE_SPACE`). speculators' arithmetic on it (x utilisation x 0.2) is kept.
"""

from __future__ import annotations

from harness.contracts.base import Attach, Attempt, Contract, Observation, Shim
from harness.support.namespace import TorchProxy
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import not_found


def needed() -> bool:
    import torch

    return not torch.cuda.is_available()


def platform_mem_get_info() -> tuple[int, int]:
    import torch
    from vllm.platforms import current_platform

    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()
    budget = int(current_platform.get_device_total_memory())
    return budget, budget


def apply(ns: dict, current, state=None) -> None:
    if not needed():
        return
    real_torch = current("torch")
    cuda = TorchProxy(real_torch.cuda, mem_get_info=platform_mem_get_info)
    ns["torch"] = TorchProxy(real_torch, cuda=cuda)


def probe(ctx) -> Observation:
    import torch

    unshimmed, _ = Attempt.run(torch.cuda.mem_get_info)
    shimmed, value = Attempt.run(platform_mem_get_info)
    facts = {"cuda_available": torch.cuda.is_available(), "shim_selected": needed()}
    if value:
        facts["budget_bytes"] = int(value[0])
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
PLATFORM = ("vllm.platforms.interface", "Platform", "get_device_total_memory")  # what the memory shim calls


def memory_budget(tree, used, follower) -> list[Fact]:
    module, cls_name, method = PLATFORM
    symbol = f"{module}:{cls_name}.{method}"
    cls = tree.lookup(f"{module}.{cls_name}")
    if cls is None:
        return [not_found(CONTRACT.id, symbol, "shim-dependency", cls_name)]
    fn = tree.member(cls, method)
    return [
        Fact(
            CONTRACT.id,
            symbol,
            "shim-dependency",
            "present" if fn is not None else "absent",
            fn is not None,
            "shim-dependency-missing",
            tree.where(fn if fn is not None else cls),
        )
    ]


CONTRACT = Contract(
    id="memory",
    assumes="torch.cuda.mem_get_info() returns (free, total) device memory",
    failures=(r"(RuntimeError|AssertionError|AcceleratorError): .*(CUDA|NVIDIA|driver|GPU)",),
    shims=(Shim(Attach.GENERATOR, apply),),
    gate_checks=(memory_budget,),
    upstream="not a vLLM change: CPU builds have no torch.cuda.mem_get_info (every CPU build of the matrix)",
)
