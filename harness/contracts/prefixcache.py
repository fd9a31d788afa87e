"""C-prefixcache: every `generate()` returns hidden states for every prompt token.

vLLM turns prefix caching on by default from 0.12 (`CacheConfig.enable_prefix_caching = True`).
Once Requests carry block hashes (see C-request), a prompt whose blocks were seen before is
scheduled from the first uncached token: the prefill, and therefore the capture, covers only the
tail, and speculators slices the short result without noticing (measured on an H200 with vLLM
0.20: 204 rows for 3,804 tokens). Shim: build speculators' CacheConfig with prefix caching off
(what speculators 0.4.x later did). The harness also checks rows against tokens on every call.
"""

from __future__ import annotations

import re

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import imported, not_found


def caching_default() -> bool:
    from vllm.config import CacheConfig

    return bool(CacheConfig(block_size=16).enable_prefix_caching)


def needed() -> bool:
    return caching_default()


def apply(ns: dict, current, state=None) -> None:
    if not needed():
        return
    real = current("CacheConfig")

    def CacheConfig(**kwargs):  # noqa: N802
        kwargs["enable_prefix_caching"] = False
        return real(**kwargs)

    ns["CacheConfig"] = CacheConfig


def scheduled_twice(ctx, vllm_config, n_tokens: int) -> tuple[int, int]:
    """Schedule one prompt, finish it the way speculators does, schedule it again: tokens scheduled each time."""
    prompt = ctx.prompt(n_tokens)
    sched = ctx.new_scheduler(vllm_config)
    counts = []
    for _ in range(2):
        req = ctx.new_request(vllm_config, prompt)
        sched.add_request(req)
        out = sched.schedule()
        counts.append(out.num_scheduled_tokens.get(req.request_id, 0))
        sched.finish_requests([req.request_id], ctx.finished_aborted())
    return counts[0], counts[1]


def probe(ctx) -> Observation:
    n = 3 * ctx.block_size + 5

    def attempt(disable: set[str]):
        cfg = ctx.speculators_vllm_config(disable=disable)
        first, second = scheduled_twice(ctx, cfg, n)
        if second < n:
            raise SilentTruncation(f"second prefill of a {n}-token prompt computes {second} tokens (first: {first})")
        return first, second

    unshimmed, _ = Attempt.run(lambda: attempt({CONTRACT.id}))
    shimmed, counts = Attempt.run(lambda: attempt(set()))
    facts = {"enable_prefix_caching_default": caching_default(), "shim_selected": needed(), "prompt_tokens": n}
    if counts:
        facts["scheduled_tokens_shimmed"] = list(counts)
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


class SilentTruncation(RuntimeError):
    """Fewer hidden-state rows than prompt tokens, with no error from vLLM."""


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
def _default(attr) -> str:
    text = "" if attr.value is None else str(attr.value)
    m = re.match(r"Field\((?:.*\b)?default=([^,)]+)", text)
    return m.group(1).strip() if m else text or "(required)"


def caching(tree, used, follower):
    """(CacheConfig.enable_prefix_caching attribute, whether speculators' CacheConfig gets it on)."""
    symbol = imported(used, "CacheConfig")
    cls = follower.resolve_import(symbol) if symbol else None
    attr = tree.member(cls, "enable_prefix_caching") if cls is not None else None
    if attr is None:
        return None, None
    passed = any("enable_prefix_caching" in c.keywords for c in used.calls_named("CacheConfig"))
    return attr, (not passed and _default(attr) == "True")


def prefix_caching(tree, used, follower) -> list[Fact]:
    symbol = f"{imported(used, 'CacheConfig')}.enable_prefix_caching"
    attr, on = caching(tree, used, follower)
    if attr is None:
        return [not_found(CONTRACT.id, symbol, "default", "CacheConfig.enable_prefix_caching")]
    return [
        Fact(
            CONTRACT.id,
            symbol,
            "default",
            f"default {_default(attr)}",
            not on,
            "default-changed",
            tree.where(attr, attr.lineno),
        )
    ]


CONTRACT = Contract(
    id="prefixcache",
    assumes="a prefill computes (and captures) every prompt token, also for prompts seen before",
    failures=(r"SilentTruncation: ", r"IncompleteExtraction: "),
    shims=(Shim(Attach.GENERATOR, apply),),
    gate_owns=(("vllm.config:CacheConfig", ""),),
    gate_covers=(
        GateCover("default-changed", apply, "builds speculators' CacheConfig with enable_prefix_caching=False"),
    ),
    gate_checks=(prefix_caching,),
    upstream="prefix caching is on by default in the CacheConfig speculators builds from vLLM 0.12.0 (CPU matrix)",
)
