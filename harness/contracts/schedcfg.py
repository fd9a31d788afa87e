"""C-schedcfg: `SchedulerConfig(max_num_seqs=, max_model_len=, max_num_batched_tokens=)` builds a config.

From vLLM 0.12 `max_model_len` and `is_encoder_decoder` are required InitVars; speculators 0.3.0
does not pass `is_encoder_decoder`, so pydantic refuses the config. Shim: pass
`is_encoder_decoder=False` (speculators only serves decoder-only targets) when the installed
SchedulerConfig requires it.
"""

from __future__ import annotations

import inspect

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim


def needed() -> bool:
    from vllm.config import SchedulerConfig

    param = inspect.signature(SchedulerConfig).parameters.get("is_encoder_decoder")
    return param is not None and param.default is inspect.Parameter.empty


def apply(ns: dict, current, state=None) -> None:
    if not needed():
        return
    real = current("SchedulerConfig")

    def SchedulerConfig(**kwargs):  # noqa: N802 - stands in for the class speculators calls
        kwargs.setdefault("is_encoder_decoder", False)
        return real(**kwargs)

    ns["SchedulerConfig"] = SchedulerConfig


def probe(ctx) -> Observation:
    # speculators' own `_create_vllm_config`, with every shim but this one, then with all shims.
    unshimmed, _ = Attempt.run(lambda: ctx.speculators_vllm_config(disable={CONTRACT.id}))
    shimmed, cfg = Attempt.run(lambda: ctx.speculators_vllm_config())
    facts = {"shim_selected": needed(), "speculators_keywords": ctx.keywords("SchedulerConfig")}
    if cfg is not None:
        sc = cfg.scheduler_config
        facts.update(
            max_model_len=cfg.model_config.max_model_len,
            async_scheduling=sc.async_scheduling,
            max_num_batched_tokens=sc.max_num_batched_tokens,
        )
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


CONTRACT = Contract(
    id="schedcfg",
    assumes="SchedulerConfig(max_num_seqs=, max_model_len=, max_num_batched_tokens=) builds a config",
    failures=(r"ValidationError: .*is_encoder_decoder.*Field required",),
    shims=(Shim(Attach.GENERATOR, apply),),
    gate_owns=(("vllm.config:SchedulerConfig", ""),),
    gate_covers=(
        GateCover(
            "required-parameter-added",
            apply,
            "passes is_encoder_decoder=False (speculators only serves decoder-only targets)",
            lambda f: set(f.detail.get("parameters", ())) <= {"is_encoder_decoder"},
            "the new required parameter is is_encoder_decoder",
        ),
    ),
    upstream="vLLM #29859 removed the default of SchedulerConfig's is_encoder_decoder InitVar (0.12.0)",
)
