"""C-kvlayout: the KV cache needs no EngineCore set-up step that speculators skips.

speculators 0.3.0 builds its executor, scheduler and KV-cache plan without EngineCore, replicating the set-up
EngineCore does between building the executor and the first step. Every step EngineCore adds there is one
speculators skips; the gate reads that sequence in each version (`setup_steps`, `harness.vllm_source.engine_setup`)
and names every executor call neither speculators nor a harness shim makes. Two such steps so far:

* vLLM 0.30 resolves one KV-cache layout in EngineCore (`resolve_kv_cache_layout`, then
`set_kv_cache_layout` on the workers) before the KV cache is planned, and reading an unresolved
layout raises. speculators builds its own scheduler and KV-cache plan without EngineCore, so its
generator fails at start-up. Shim: right after the executor starts, do what EngineCore does: resolve
the layout from the workers' supported layouts and KV-cache specs and publish it. Native where the
installed vLLM has no layout resolution.
* vLLM 0.34's extensible KV cache (on by default on CUDA/ROCm): `initialize_from_config` only reserves address
  space; EngineCore then measures memory after warm-up, calls `finalize_extensible_kv_cache` and
  `executor.extend_kv_cache(num_blocks)`. Without that step the scheduler speculators built from the reserved
  capacity hands out blocks that are not mapped. Shim (`no_extensible_cache`): right after the executor starts,
  turn the extensible cache off on the executor's config and every worker, which is EngineCore's own path where
  the cache is unsupported (`disable_extensible_kv_cache`): `initialize_from_config` then allocates the whole cache
  speculators planned, as before 0.34. Replaying the extension instead would need the scheduler built after the
  measurement, which speculators builds before. Selected by the config's flag, never by version: the CPU platform
  leaves it off, so on CPU builds the shim stays unselected and its effect is CUDA's to show.
"""

from __future__ import annotations

import ast
import importlib

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import not_found


def _resolver():
    for module in ("vllm.v1.attention.backends.utils",):
        try:
            return importlib.import_module(module).resolve_kv_cache_layout
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
    layout = _resolver()(
        vllm_config,
        real_executor.collective_rpc("get_supported_kv_cache_layouts"),
        [s for per_rank in specs for s in per_rank.values()],
    )
    interleave = getattr(vllm_config.parallel_config, "cp_kv_cache_interleave_size", None)
    if interleave is not None and _takes_interleave():  # 0.34: the workers take the context-parallel interleave too
        real_executor.collective_rpc("set_kv_cache_layout", args=(layout.name, interleave))
    else:
        real_executor.collective_rpc("set_kv_cache_layout", args=(layout.name,))
    return layout.name


def _takes_interleave() -> bool:
    """Whether the installed workers' `set_kv_cache_layout` takes the interleave size EngineCore passes with it."""
    import inspect

    from vllm.v1.worker.worker_base import WorkerBase

    return "cp_kv_cache_interleave_size" in inspect.signature(WorkerBase.set_kv_cache_layout).parameters


EXTENSIBLE_STEP = "extensible-kv-cache-step"


def extensible(vllm_config) -> bool:
    return bool(getattr(vllm_config.cache_config, "enable_extensible_kv_cache", False))


def no_extensible_cache(view, state) -> bool:
    """Turn the extensible KV cache off where the config has it on, as EngineCore does where unsupported."""
    if not extensible(state.vllm_config):
        return False
    view.real.collective_rpc("disable_extensible_kv_cache")
    state.vllm_config.cache_config.enable_extensible_kv_cache = False
    return True


def probe(ctx) -> Observation:
    fresh = ctx.speculators_vllm_config()  # the config speculators builds, no EngineCore ran on it
    cc = fresh.cache_config
    if not hasattr(cc, "get_resolved_kv_cache_layout"):
        return Observation(CONTRACT, Attempt(True), None, {"layout_resolution": "absent in this vLLM"})
    unshimmed, _ = Attempt.run(cc.get_resolved_kv_cache_layout)
    shimmed, layout = Attempt.run(ctx.vllm_config.cache_config.get_resolved_kv_cache_layout)
    facts = {
        "resolved_layout": str(layout) if layout is not None else None,
        "shim_selected": needed(fresh),
        "extensible_kv_cache": extensible(fresh) if hasattr(cc, "enable_extensible_kv_cache") else "absent",
    }
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
CACHE_CONFIG = "vllm.config.cache"
LAYOUT_UNRESOLVED = "KV cache layout has not been resolved"
LAYOUT_RESOLVER = "vllm.v1.attention.backends.utils"


def kv_layout_resolution(tree, used, follower) -> list[Fact]:
    from harness.vllm_source.source_files import parse

    f = tree.module_file(CACHE_CONFIG)
    if f is None:
        return [not_found(CONTRACT.id, f"{CACHE_CONFIG}:CacheConfig", "layout", "vllm/config/cache.py")]
    lines = tree.string_lines(CACHE_CONFIG, LAYOUT_UNRESOLVED)
    resolver = tree.module_file(LAYOUT_RESOLVER)
    has_resolver = resolver is not None and any(
        isinstance(n, ast.FunctionDef) and n.name == "resolve_kv_cache_layout" for n in parse(str(resolver)).body
    )
    return [
        Fact(
            CONTRACT.id,
            f"{CACHE_CONFIG}:CacheConfig.get_resolved_kv_cache_layout",
            "layout",
            "must be resolved by EngineCore first" if lines else "no resolution step",
            not lines,
            "layout-resolution-required",
            f"{f.relative_to(tree.root)}:{lines[0] if lines else 1}",
            detail={"resolver_present": has_resolver},
        )
    ]


#: EngineCore set-up steps speculators does its own way, with how (read from its generator).
SPECULATORS_OWN_WAY = {
    "determine_available_memory": "speculators sizes the KV cache itself from torch.cuda.mem_get_info (C-memory)",
    "compile_or_warm_up_model": "speculators builds the model with enforce_eager=True: nothing to compile or capture",
    "update_max_model_len": "speculators passes max_model_len itself (2048 by default); EngineCore changes it, and "
    "tells the workers, only when it auto-fits a max_model_len of -1",
}


def _made_by(name: str, speculators_calls: set, speculators_rpc: set, shims: dict[str, str]) -> str | None:
    """Who makes an executor call of EngineCore's set-up for speculators' generator: speculators itself (or its own
    way), a harness shim, or nobody (None)."""
    rpc = name[:-1] if name.endswith("s") else name  # get_kv_cache_specs -> get_kv_cache_spec
    if name in speculators_calls or rpc in speculators_rpc:
        return "speculators replicates it"
    if name in SPECULATORS_OWN_WAY:
        return SPECULATORS_OWN_WAY[name]
    if name in shims or rpc in shims:
        return f"a harness shim makes it ({shims.get(name) or shims[rpc]})"
    return None


def setup_steps(tree, used, follower) -> list[Fact]:
    """One fact per executor call EngineCore makes while setting up the KV cache: replicated by speculators,
    made by a harness shim (from the shim surface's `rpc` entries), or skipped (a finding when new)."""
    from harness.vllm_source import engine_setup, shim_surface

    steps, rel = engine_setup.steps(tree.root)
    symbol = f"{engine_setup.MODULE}:{engine_setup.CLASS}.{engine_setup.METHOD}"
    if rel is None:
        return [not_found(CONTRACT.id, symbol, "setup-step", f"{engine_setup.CLASS}.{engine_setup.METHOD}")]
    speculators_calls = {c.callee.rsplit(".", 1)[-1] for c in used.calls if ".executor." in c.callee}
    speculators_rpc = set(used.rpc_methods)
    shims: dict[str, str] = {}
    for e in shim_surface.load():
        if e["kind"] == "rpc":
            shims.setdefault(e["name"], e["site"])
    facts, seen = [], set()
    for step in (s for s in steps if s.on_executor):
        if step.name in seen:
            continue
        seen.add(step.name)
        made_by = _made_by(step.name, speculators_calls, speculators_rpc, shims)
        turned_off = made_by is None and "extensible" in (step.condition or "")
        value = f"EngineCore calls {step.describe()}; " + (made_by or "neither speculators nor a harness shim does")
        facts.append(
            Fact(
                CONTRACT.id,
                f"{symbol} -> executor.{step.name}()",
                "setup-step",
                value,
                made_by is not None,
                EXTENSIBLE_STEP if turned_off else "setup-step-skipped",
                f"{rel}:{step.line}",
                detail={
                    "condition": step.condition,
                    "turned_off_by": shims.get("disable_extensible_kv_cache"),
                    "why": f"EngineCore's set-up calls {step.describe()} between building the "
                    f"executor and the first step; speculators' generator skips it and no "
                    f"shim replays it",
                },
            )
        )
    return facts


CONTRACT = Contract(
    id="kvlayout",
    assumes="the KV cache needs no EngineCore set-up step speculators skips (layout resolution, extension)",
    failures=(r"KV cache layout has not been resolved",),
    shims=(Shim(Attach.EXECUTOR, apply_executor), Shim(Attach.EXECUTOR, no_extensible_cache)),
    gate_covers=(
        GateCover(
            "layout-resolution-required",
            apply_executor,
            "resolves the layout from the workers' supported layouts and KV-cache specs and publishes it, "
            "as EngineCore does",
            lambda f: bool(f.detail.get("resolver_present")),
            "resolve_kv_cache_layout exists",
        ),
        GateCover(
            EXTENSIBLE_STEP,
            no_extensible_cache,
            "turns the extensible KV cache off on the executor and every worker right after start "
            "(EngineCore's own path where it is unsupported), so this step has nothing to do",
            lambda f: bool(f.detail.get("turned_off_by")),
            "the shim calls disable_extensible_kv_cache",
        ),
    ),
    gate_checks=(kv_layout_resolution, setup_steps),
    upstream=(
        "vLLM #51718 (KV-cache layout standardisation, RFC #42082) made the layout a value EngineCore "
        "resolves and publishes once (first seen at 0.30.0); the extensible KV cache, on by default on "
        "CUDA/ROCm in 0.34.0 (vllm/config/cache.py, vllm/v1/worker/extensible_kv_cache.py), added "
        "finalize_extensible_kv_cache + executor.extend_kv_cache to EngineCore._initialize_kv_caches"
    ),
)
