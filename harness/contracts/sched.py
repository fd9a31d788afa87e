"""C-sched: `Scheduler(vllm_config=, kv_cache_config=, structured_output_manager=)` builds a scheduler.

vLLM 0.11.1 added a required `block_size` (EngineCore passes the cache block size times the
decode-context-parallel size); 0.20 added `hash_block_size`. Shim: pass the block size from the
config speculators built, and the same value as the hash block size where that parameter exists
(one uniform KV-cache group, as speculators plans it).
"""

from __future__ import annotations

import inspect

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim


def _params() -> dict:
    from vllm.v1.core.sched.scheduler import Scheduler

    return dict(inspect.signature(Scheduler.__init__).parameters)


def needed() -> bool:
    p = _params().get("block_size")
    return p is not None and p.default is inspect.Parameter.empty


def block_size_of(vllm_config) -> int:
    pc = vllm_config.parallel_config
    return int(vllm_config.cache_config.block_size) * int(getattr(pc, "decode_context_parallel_size", 1) or 1)


def apply(ns: dict, current, state=None) -> None:
    if not needed():
        return
    real = current("Scheduler")
    takes_hash = "hash_block_size" in _params()

    def Scheduler(**kwargs):  # noqa: N802
        size = block_size_of(kwargs["vllm_config"])
        kwargs.setdefault("block_size", size)
        if takes_hash:
            kwargs.setdefault("hash_block_size", size)
        return real(**kwargs)

    ns["Scheduler"] = Scheduler


def probe(ctx) -> Observation:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    keywords = ctx.keywords("Scheduler")

    def build(factory):
        values = {
            "vllm_config": ctx.vllm_config,
            "kv_cache_config": ctx.kv_cache_config,
            "structured_output_manager": StructuredOutputManager(vllm_config=ctx.vllm_config),
        }
        sched = factory(**{k: values[k] for k in keywords})
        # Not just constructed: it schedules a prompt.
        req = ctx.new_request(ctx.vllm_config, ctx.prompt(ctx.block_size + 3))
        sched.add_request(req)
        out = sched.schedule()
        assert out.num_scheduled_tokens[req.request_id] == ctx.block_size + 3
        return sched

    ns: dict = {}
    apply(ns, lambda name: ns.get(name, Scheduler), None)
    unshimmed, _ = Attempt.run(lambda: build(Scheduler))
    shimmed, _ = Attempt.run(lambda: build(ns.get("Scheduler", Scheduler)))
    p = _params()
    facts = {
        "required": [n for n, v in p.items() if n != "self" and v.default is inspect.Parameter.empty],
        "has_hash_block_size": "hash_block_size" in p,
        "speculators_keywords": keywords,
        "shim_selected": needed(),
    }
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


CONTRACT = Contract(
    id="sched",
    assumes="Scheduler(vllm_config=, kv_cache_config=, structured_output_manager=) builds a scheduler",
    failures=(r"TypeError: .*missing 1 required positional argument: 'block_size'",),
    shims=(Shim(Attach.GENERATOR, apply),),
    gate_owns=(("vllm.v1.core.sched.scheduler:Scheduler", ""),),
    gate_covers=(
        GateCover(
            "required-parameter-added",
            apply,
            "passes block_size (and hash_block_size where it exists) from the config speculators built",
            lambda f: set(f.detail.get("parameters", ())) <= {"block_size", "hash_block_size"},
            "the new required parameters are block_size/hash_block_size",
        ),
    ),
    upstream="vLLM 0.11.1 made Scheduler(block_size=) required, later also hash_block_size (0.20.0)",
)
