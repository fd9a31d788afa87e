"""Tensor parallelism on vLLM's CPU build: what N ranks need from the machine, settled before the engine starts.

vLLM's CPU build runs one worker process per rank and binds each rank's OpenMP threads to CPU cores. Left to itself
(`VLLM_CPU_OMP_THREADS_BIND=auto`) it binds one rank per NUMA node and refuses more ranks than nodes ("Not enough
allowed NUMA nodes to bind threads"): a one-node machine runs TP=1 only. And speculators builds its CacheConfig with
vLLM's default swap space (4 GiB per rank), which vLLM refuses beyond 70 % of the machine's memory ("Too large swap
space": 8 ranks on a 24 GiB machine). So, for N > 1 on a CPU build:

* threads: the cores this process may use are split into N contiguous groups, one per rank ("0|1" for 2 ranks on
  2 cores); with more ranks than cores the ranks share cores round-robin ("0|1|0|1"). A binding the user set in
  `VLLM_CPU_OMP_THREADS_BIND` is kept as it is (the override);
* swap space: where N x vLLM's default would pass 40 % of the machine's memory (vLLM's warning line), each rank gets
  the share that stays under it; an extraction only prefills, so nothing is ever swapped out;
* memory: each rank holds its KV cache (`VLLM_CPU_KVCACHE_SPACE` GiB) and a process of its own (torch, vLLM, its
  shard of the weights); where N of them do not fit in the memory available now, the start is refused in one line
  that says what one rank needs and what there is.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

BIND = "VLLM_CPU_OMP_THREADS_BIND"
#: A CPU rank's process with torch and vLLM loaded, its KV cache aside (GiB): 1.1 GiB resident per rank was measured
#: on vLLM 0.16.0's CPU build (tiny-llama, TP=2, float32, VLLM_CPU_KVCACHE_SPACE=1), plus a margin.
RANK_PROCESS_GIB = 1.2
DEFAULT_SWAP_GIB = 4.0
#: The share of the machine's memory N ranks' swap space may take before vLLM warns (it refuses past 70 %).
SWAP_SHARE = 0.4
GIB = 1 << 30


@dataclass(frozen=True)
class Ranks:
    """What N ranks get on this machine: the thread binding to set (None: the user's own is kept) and the swap space
    per rank (None: vLLM's default fits)."""

    size: int
    bind: str | None
    swap_gib: float | None


class CannotHold(ValueError):
    """The machine cannot hold N ranks; the message is one line."""


def binding(size: int, cores: list[int]) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `size` ranks over `cores`: contiguous groups, or round-robin where there are
    more ranks than cores."""
    if size <= len(cores):
        per = len(cores) // size
        groups = [cores[i * per : (i + 1) * per] for i in range(size)]
        return "|".join(",".join(str(c) for c in g) for g in groups)
    return "|".join(str(cores[i % len(cores)]) for i in range(size))


def swap_gib(size: int, total_gib: float) -> float | None:
    """Swap space per rank where vLLM's default would pass `SWAP_SHARE` of the machine (None: the default fits)."""
    if size * DEFAULT_SWAP_GIB <= SWAP_SHARE * total_gib:
        return None
    return max(0.0, int(SWAP_SHARE * total_gib / size * 2) / 2)  # whole half GiB, down


def plan(size: int, cores: list[int], total_gib: float, available_gib: float, kv_gib: float) -> Ranks:
    """What `size` ranks need (module docstring); CannotHold where the memory available cannot hold them."""
    need = size * (kv_gib + RANK_PROCESS_GIB)
    if need > available_gib:
        raise CannotHold(
            f"tensor_parallel_size={size} on vLLM's CPU build needs about {need:.1f} GiB ({kv_gib:g} GiB KV cache "
            f"+ {RANK_PROCESS_GIB:g} GiB process per rank, weights aside); {available_gib:.1f} GiB is available here"
        )
    bind = None if os.environ.get(BIND) else binding(size, cores)
    return Ranks(size, bind, swap_gib(size, total_gib))


def for_this_machine(size: int) -> Ranks | None:
    """The plan for `size` ranks on this machine where vLLM runs on its CPU build and size > 1 (else None)."""
    if size <= 1:
        return None
    from vllm.platforms import current_platform

    if current_platform.device_type != "cpu":
        return None
    import psutil

    mem = psutil.virtual_memory()
    kv = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 4)  # vLLM's CPU default: 4 GiB
    cores = sorted(os.sched_getaffinity(0))
    return plan(size, cores, mem.total / GIB, mem.available / GIB, kv)


@contextlib.contextmanager
def binding_set(ranks: Ranks | None):
    """The binding in the environment while the engine starts (its workers inherit it); the caller's restored."""
    if ranks is None or ranks.bind is None:
        yield
        return
    before = os.environ.get(BIND)
    os.environ[BIND] = ranks.bind
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(BIND, None)
        else:
            os.environ[BIND] = before


def cache_kwargs(ranks: Ranks | None, cache_config_cls) -> dict:
    """CacheConfig keywords for these ranks: the swap space, where this vLLM's CacheConfig takes one. What
    speculators' namespace holds may be a shim's wrapper taking **kwargs (C-prefixcache's): then vLLM's own class
    is asked (a wrapper's signature says nothing; at TP=8 that silence let vLLM refuse 4 GiB x 8 of swap)."""
    import inspect

    if ranks is None or ranks.swap_gib is None:
        return {}
    params = inspect.signature(cache_config_cls).parameters
    if "swap_space" not in params and any(p.kind is p.VAR_KEYWORD for p in params.values()):
        from vllm.config import CacheConfig

        params = inspect.signature(CacheConfig).parameters
    return {"swap_space": ranks.swap_gib} if "swap_space" in params else {}
