"""C-request: `Request(request_id=, prompt_token_ids=, sampling_params=, pooling_params=, eos_token_id=,
arrival_time=)` makes a request the scheduler can prefill.

Two breaks meet here. With prefix caching on (vLLM's default from 0.12), the block pool reads one
block hash per full block, and speculators attaches no `block_hasher`: the first prompt that fills
a block fails (an AssertionError in block_pool.py up to 0.25, an IndexError from 0.26). And vLLM
0.17 removed `eos_token_id` from `Request.__init__` (EOS lives in SamplingParams since).
Shim: attach vLLM's own request block hasher (built as EngineCore builds it) whenever the config
caches prefixes, and drop `eos_token_id` where Request no longer takes it (a prefill-only request
never reaches EOS).
"""

from __future__ import annotations

import importlib
import inspect

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import imported, not_found
from harness.vllm_source.signatures import signature

#: Shims also left out in both arms of the proof: the block-hash requirement only bites with prefix
#: caching on (vLLM's default), so C-prefixcache's shim must be off for this shim to be exercised.
PROOF_CONTEXT = frozenset({"prefixcache"})


def _params() -> dict:
    from vllm.v1.request import Request

    return dict(inspect.signature(Request.__init__).parameters)


def takes_eos() -> bool:
    return "eos_token_id" in _params()


def takes_block_hasher() -> bool:
    return "block_hasher" in _params()


def needed() -> bool:
    from harness.contracts.prefixcache import caching_default

    return not takes_eos() or (takes_block_hasher() and caching_default())


def _hash_fn_by_name():
    for module in ("vllm.utils.hashing", "vllm.utils"):
        try:
            return importlib.import_module(module).get_hash_fn_by_name
        except (ImportError, AttributeError):
            continue
    raise ImportError("get_hash_fn_by_name not found in vllm.utils.hashing or vllm.utils")


_HASHERS: dict[tuple, object] = {}


def block_hasher_for(vllm_config):
    """vLLM's request block hasher for this config, built the way EngineCore builds it.

    `init_none_hash` seeds the chain of block hashes (randomly, unless PYTHONHASHSEED is set), so it
    runs once per process: re-running it would make every later request hash differently.
    """
    from vllm.v1.core import kv_cache_utils

    from harness.contracts.sched import block_size_of

    key = (block_size_of(vllm_config), vllm_config.cache_config.prefix_caching_hash_algo)
    if key not in _HASHERS:
        hash_fn = _hash_fn_by_name()(key[1])
        if getattr(kv_cache_utils, "NONE_HASH", None) is None:
            kv_cache_utils.init_none_hash(hash_fn)
        _HASHERS[key] = kv_cache_utils.get_request_block_hasher(key[0], hash_fn)
    return _HASHERS[key]


def apply(ns: dict, current, state=None) -> None:
    if not needed():
        return
    real = current("Request")
    accepted = set(_params())

    def Request(**kwargs):  # noqa: N802
        if "eos_token_id" not in accepted:
            kwargs.pop("eos_token_id", None)
        cfg = getattr(state, "vllm_config", None)
        if "block_hasher" in accepted and cfg is not None and cfg.cache_config.enable_prefix_caching:
            kwargs.setdefault("block_hasher", block_hasher_for(cfg))
        return real(**kwargs)

    ns["Request"] = Request


def probe(ctx) -> Observation:
    from types import SimpleNamespace

    from vllm.v1.request import Request

    # The config speculators builds: vLLM's default prefix caching (C-prefixcache's shim off).
    cfg = ctx.speculators_vllm_config(disable={"prefixcache"})
    n = 2 * ctx.block_size + 3
    keywords = ctx.keywords("Request")

    def prefill(factory):
        values = ctx.request_values(ctx.prompt(n))
        req = factory(**{k: values[k] for k in keywords})
        sched = ctx.new_scheduler(cfg)
        sched.add_request(req)
        out = sched.schedule()
        return {"scheduled": out.num_scheduled_tokens.get(req.request_id, 0), "block_hashes": len(req.block_hashes)}

    ns: dict = {}
    apply(ns, lambda name: ns.get(name, Request), SimpleNamespace(vllm_config=cfg))
    unshimmed, _ = Attempt.run(lambda: prefill(Request))
    shimmed, seen = Attempt.run(lambda: prefill(ns.get("Request", Request)))
    facts = {
        "takes_eos_token_id": takes_eos(),
        "takes_block_hasher": takes_block_hasher(),
        "prefix_caching": bool(cfg.cache_config.enable_prefix_caching),
        "prompt_tokens": n,
        "speculators_keywords": keywords,
        "shim_selected": needed(),
    }
    if seen:
        facts["shimmed_prefill"] = seen
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
HASHER_HELPERS = ("get_request_block_hasher", "init_none_hash")  # what the request shim builds the hasher with


def block_hashes(tree, used, follower) -> list[Fact]:
    from harness.contracts.kvhelpers import OLD_HOME
    from harness.contracts.prefixcache import caching

    symbol = imported(used, "Request")
    cls = follower.resolve_import(symbol) if symbol else None
    sig = signature(tree, cls, bound=True) if cls is not None else None
    attr, caching_on = caching(tree, used, follower)
    if sig is None or attr is None:
        return [not_found(CONTRACT.id, f"{symbol}(block_hasher=)", "block-hashes", "Request or CacheConfig")]
    param = sig.named("block_hasher")
    passed = any("block_hasher" in c.keywords for c in used.calls_named("Request"))
    needed = param is not None and not passed and caching_on
    helpers = all(tree.lookup(f"{OLD_HOME}.{h}") is not None for h in HASHER_HELPERS)
    value = "needed: prefix caching is on by default and speculators passes no block_hasher" if needed else "not needed"
    evidence = (
        f"{sig.where.rsplit(':', 1)[0]}:{param.line}"
        if needed and param is not None and param.line
        else tree.where(attr, attr.lineno)
    )
    return [
        Fact(
            CONTRACT.id,
            f"{symbol}(block_hasher=)",
            "block-hashes",
            value,
            not needed,
            "block-hashes-required",
            evidence,
            detail={"hasher_helpers_present": helpers},
        )
    ]


CONTRACT = Contract(
    id="request",
    assumes="Request(request_id=, prompt_token_ids=, sampling_params=, pooling_params=, eos_token_id=, "
    "arrival_time=) is prefilled by the scheduler, prompts of one full block or more included",
    failures=(
        r"AssertionError: .*@ .*block_pool\.py",
        r"IndexError: .*@ .*block_pool\.py",
        r"TypeError: .*unexpected keyword argument 'eos_token_id'",
    ),
    shims=(Shim(Attach.GENERATOR, apply),),
    gate_owns=(("vllm.v1.request:Request", ""),),
    gate_covers=(
        GateCover(
            "keyword-removed",
            apply,
            "drops eos_token_id where Request no longer takes it (a prefill-only request never reaches EOS)",
            lambda f: f.detail.get("keyword") == "eos_token_id",
            "the keyword is eos_token_id",
        ),
        GateCover(
            "block-hashes-required",
            apply,
            "attaches vLLM's own request block hasher, built the way EngineCore builds it, when the config "
            "caches prefixes",
            lambda f: bool(f.detail.get("hasher_helpers_present")),
            "kv_cache_utils still has get_request_block_hasher and init_none_hash",
        ),
    ),
    gate_checks=(block_hashes,),
    upstream=(
        "vLLM 0.12.0 requires block hashes on a Request when prefix caching is on and dropped eos_token_id from Request"
    ),
)
