"""C-kvlayout: the KV-cache layout needs nothing from speculators.

vLLM 0.32 resolves one KV-cache layout in EngineCore (`resolve_kv_cache_layout`, then
`set_kv_cache_layout` on the workers) before the KV cache is planned, and reading an unresolved
layout raises. speculators builds its own scheduler and KV-cache plan without EngineCore, so its
generator fails at start-up. Shim: right after the executor starts, do what EngineCore does: resolve
the layout from the workers' supported layouts and KV-cache specs and publish it. Native where the
installed vLLM has no layout resolution.
"""

from __future__ import annotations

import importlib

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.gate.facts import Fact
from harness.gate.lookups import not_found

def _resolver():
    for module in ("vllm.v1.attention.backends.utils",):
        try:
            return getattr(importlib.import_module(module), "resolve_kv_cache_layout")
        except (ImportError, AttributeError):
            continue
    return None


def needed(vllm_config) -> bool:
    cc = vllm_config.cache_config
    return _resolver() is not None and hasattr(cc, "get_resolved_kv_cache_layout") and cc.kv_cache_layout is None


def apply_executor(view, state) -> str | None:
    """Resolve and publish the layout as EngineCore does; returns its name (None when not needed)."""
    return resolve_layout(view.real, state.vllm_config)


def resolve_layout(real_executor, vllm_config) -> str | None:
    if not needed(vllm_config):
        return None
    specs = real_executor.collective_rpc("get_kv_cache_spec")
    layout = _resolver()(vllm_config, real_executor.collective_rpc("get_supported_kv_cache_layouts"),
                         [s for per_rank in specs for s in per_rank.values()])
    real_executor.collective_rpc("set_kv_cache_layout", args=(layout.name,))
    return layout.name


def probe(ctx) -> Observation:
    fresh = ctx.speculators_vllm_config()  # the config speculators builds, no EngineCore ran on it
    cc = fresh.cache_config
    if not hasattr(cc, "get_resolved_kv_cache_layout"):
        return Observation(CONTRACT, Attempt(True), None, {"layout_resolution": "absent in this vLLM"})
    unshimmed, _ = Attempt.run(cc.get_resolved_kv_cache_layout)
    shimmed, layout = Attempt.run(ctx.vllm_config.cache_config.get_resolved_kv_cache_layout)
    facts = {"resolved_layout": str(layout) if layout is not None else None, "shim_selected": needed(fresh)}
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
CACHE_CONFIG = "vllm.config.cache"
LAYOUT_UNRESOLVED = "KV cache layout has not been resolved"
LAYOUT_RESOLVER = "vllm.v1.attention.backends.utils"


def kv_layout_resolution(tree, used, follower) -> list[Fact]:
    f = tree.module_file(CACHE_CONFIG)
    if f is None:
        return [not_found(CONTRACT.id, f"{CACHE_CONFIG}:CacheConfig", "layout", "vllm/config/cache.py")]
    lines = tree.string_lines(CACHE_CONFIG, LAYOUT_UNRESOLVED)
    resolver = tree.module_file(LAYOUT_RESOLVER)
    has_resolver = resolver is not None and "def resolve_kv_cache_layout" in resolver.read_text()
    return [Fact(CONTRACT.id, f"{CACHE_CONFIG}:CacheConfig.get_resolved_kv_cache_layout", "layout",
                 "must be resolved by EngineCore first" if lines else "no resolution step", not lines,
                 "layout-resolution-required", f"{f.relative_to(tree.root)}:{lines[0] if lines else 1}",
                 detail={"resolver_present": has_resolver})]


CONTRACT = Contract(
    id="kvlayout",
    assumes="the KV-cache layout needs no resolution step before the KV cache is planned",
    failures=(r"KV cache layout has not been resolved",),
    shims=(Shim(Attach.EXECUTOR, apply_executor),),
    gate_covers=(GateCover("layout-resolution-required", apply_executor,
                           "resolves the layout from the workers' supported layouts and KV-cache specs and publishes it, "
                           "as EngineCore does",
                           lambda f: bool(f.detail.get("resolver_present")), "resolve_kv_cache_layout exists"),),
    gate_checks=(kv_layout_resolution,),
    upstream=('vLLM #51718 (KV-cache layout standardisation, RFC #42082) made the layout a value EngineCore '
              'resolves and publishes once (first seen at 0.30.0)'),
)
