"""C-kvhelpers: the three KV-cache planning helpers speculators imports and calls.

speculators imports `_get_kv_cache_groups_uniform_spec`, `get_kv_cache_config_from_groups` and
`unify_hybrid_kv_cache_specs` from `vllm.v1.core.kv_cache_utils` and calls
`get_kv_cache_config_from_groups(vllm_config=, kv_cache_groups=, kv_cache_specs=, available_memory=)`.
vLLM 0.12 dropped `kv_cache_specs`; vLLM 0.33 moved the helpers to `kv_cache_planning` (static
reading; no CPU build of 0.33 exists to run). Shim: pass only the keywords the installed helper
takes, and make the helpers importable from the old path where they moved.
"""

from __future__ import annotations

import importlib
import inspect

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim

OLD_HOME = "vllm.v1.core.kv_cache_utils"
NEW_HOMES = ("vllm.v1.core.kv_cache_planning",)
HELPERS = ("_get_kv_cache_groups_uniform_spec", "get_kv_cache_config_from_groups", "unify_hybrid_kv_cache_specs")


def locate(name: str) -> str:
    """The module that defines helper `name` in the installed vLLM."""
    for home in (OLD_HOME, *NEW_HOMES):
        try:
            if hasattr(importlib.import_module(home), name):
                return home
        except ImportError:
            continue
    raise ImportError(f"cannot import name {name!r} from {OLD_HOME} or {', '.join(NEW_HOMES)}")


def install_import_aliases() -> list[str]:
    """Where a helper left `kv_cache_utils`, alias it there so speculators' module imports. Returns the aliases."""
    old = importlib.import_module(OLD_HOME)
    added = []
    for name in HELPERS:
        if not hasattr(old, name):
            setattr(old, name, getattr(importlib.import_module(locate(name)), name))
            added.append(name)
    return added


def needed() -> bool:
    fn = importlib.import_module(locate("get_kv_cache_config_from_groups")).get_kv_cache_config_from_groups
    return "kv_cache_specs" not in inspect.signature(fn).parameters or locate(HELPERS[0]) != OLD_HOME


def apply(ns: dict, current, state=None) -> None:
    if not needed():
        return
    real = current("get_kv_cache_config_from_groups")
    accepted = set(inspect.signature(real).parameters)

    def get_kv_cache_config_from_groups(**kwargs):
        return real(**{k: v for k, v in kwargs.items() if k in accepted})

    ns["get_kv_cache_config_from_groups"] = get_kv_cache_config_from_groups


def _call(helpers: dict, ctx, keywords: list[str]):
    spec = ctx.kv_cache_spec()
    helpers["unify_hybrid_kv_cache_specs"](spec)
    groups = helpers["_get_kv_cache_groups_uniform_spec"](spec)
    values = {
        "vllm_config": ctx.vllm_config,
        "kv_cache_groups": groups,
        "kv_cache_specs": spec,
        "available_memory": 64 << 20,
    }
    return helpers["get_kv_cache_config_from_groups"](**{k: values[k] for k in keywords})


def probe(ctx) -> Observation:
    keywords = ctx.keywords("get_kv_cache_config_from_groups")

    def unshimmed_call():
        module = importlib.import_module(OLD_HOME)
        missing = [n for n in HELPERS if not hasattr(module, n)]
        if missing:
            raise ImportError(f"cannot import name {missing[0]!r} from {OLD_HOME!r}")
        return _call({n: getattr(module, n) for n in HELPERS}, ctx, keywords)

    def shimmed_call():
        ns: dict = {}
        helpers = {n: getattr(importlib.import_module(locate(n)), n) for n in HELPERS}
        apply(ns, lambda name: ns.get(name, helpers[name]), None)
        helpers.update(ns)
        return _call(helpers, ctx, keywords)

    unshimmed, _ = Attempt.run(unshimmed_call)
    shimmed, cfg = Attempt.run(shimmed_call)
    fn = importlib.import_module(locate("get_kv_cache_config_from_groups")).get_kv_cache_config_from_groups
    facts = {
        "homes": {n: locate(n) for n in HELPERS},
        "signature": str(inspect.signature(fn)),
        "speculators_keywords": keywords,
        "shim_selected": needed(),
    }
    if cfg is not None:
        facts["num_blocks"] = cfg.num_blocks
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


CONTRACT = Contract(
    id="kvhelpers",
    assumes="kv_cache_utils.get_kv_cache_config_from_groups(vllm_config=, kv_cache_groups=, kv_cache_specs=, "
    "available_memory=) and its two sibling helpers import and run",
    failures=(r"TypeError: .*unexpected keyword argument 'kv_cache_specs'", r"ImportError: cannot import name"),
    shims=(Shim(Attach.GENERATOR, apply), Shim(Attach.IMPORT, install_import_aliases)),
    gate_owns=((f"{OLD_HOME}:*", None),),
    gate_covers=(
        GateCover(
            "keyword-removed",
            apply,
            "wraps get_kv_cache_config_from_groups and passes only the keywords the installed helper takes",
            lambda f: ":get_kv_cache_config_from_groups(" in f.symbol,
            "the helper is get_kv_cache_config_from_groups",
        ),
        GateCover(
            "import-moved",
            install_import_aliases,
            "sets each helper that left kv_cache_utils back on kv_cache_utils from its new home, so "
            "speculators' import works",
            lambda f: f.detail.get("moved_to") in NEW_HOMES and f.detail.get("name") in HELPERS,
            f"the helper moved to one of {', '.join(NEW_HOMES)}",
        ),
    ),
    upstream=(
        "vLLM 0.12.0 dropped the kv_cache_specs keyword of get_kv_cache_config_from_groups; after 0.32 "
        "the helpers move to kv_cache_planning (seen by the gate)"
    ),
)
