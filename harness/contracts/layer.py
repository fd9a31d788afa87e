"""C-layer: decoder layers take `layer(hidden_states=, positions=, residual=)` and return (hidden, residual).

speculators' patched forward replaces the stack's own loop and calls each layer with exactly those
three keywords. Anything else the stack's own loop passes is lost: DeepseekV2's layer gained
`llama_4_scaling` in vLLM 0.12, which its own forward computes when the checkpoint's config sets
`llama_4_scaling`. For such a checkpoint the patched loop silently diverges; no shim restores it
(the contract is then broken). Observed on the loaded layers, in the worker.
"""

from __future__ import annotations

import inspect

from harness.contracts.base import Attempt, Contract, GateCover, Observation

PASSED = ("hidden_states", "positions", "residual")
#: Layer parameters the stack's own loop passes but whose value only matters when the checkpoint's
#: config sets the named key; the probe fails the contract for such a checkpoint (no shim).
CONFIG_GATED = {"llama_4_scaling": "llama_4_scaling"}


def worker_probe(worker) -> dict:
    from harness.contracts.kimistack import decoder_stack

    stack = decoder_stack(worker.model_runner.model)
    layers = list(stack.layers)[stack.start_layer:stack.end_layer]
    kinds: dict[str, dict] = {}
    failure = None
    for layer in layers:
        name = type(layer).__name__
        if name in kinds:
            continue
        sig = inspect.signature(layer.forward)
        extra = [p for p in sig.parameters if p not in PASSED and p not in ("self", "args", "kwargs")]
        kinds[name] = {"signature": str(sig), "not_passed": extra}
        try:
            sig.bind(**{p: None for p in PASSED})
        except TypeError as exc:
            failure = failure or Attempt.failed("TypeError", f"{name}.forward{sig}: {exc}")
    config = getattr(worker.model_runner.model_config, "hf_text_config", None) or worker.model_runner.model_config.hf_config
    facts = {"layers": kinds}
    for param, key in CONFIG_GATED.items():
        value = getattr(config, key, None)
        facts[f"config_{key}"] = value
        if failure is None and value and any(param in k["not_passed"] for k in kinds.values()):
            failure = Attempt.failed("SilentDivergence", f"the stack passes {param} (set in this config); "
                                     "speculators' patched loop does not")
    return {"unshimmed": failure or Attempt(True), "facts": facts}


def probe(ctx) -> Observation:
    r = ctx.worker_call(worker_probe)
    return Observation(CONTRACT, r["unshimmed"], None, r["facts"], subject=ctx.model.family)


def _config_gated_and_unset(finding) -> bool:
    """The gate's finding names only config-gated extras, and the given checkpoint config sets none of them."""
    extras = set(finding.detail.get("not_passed_by_speculators", ()))
    cfg = finding.detail.get("checkpoint_config")
    return extras <= set(CONFIG_GATED) and cfg is not None and not any(cfg.get(CONFIG_GATED[k]) for k in extras)


CONTRACT = Contract(
    id="layer",
    assumes="layer(hidden_states=, positions=, residual=) is the whole call the stack's own loop makes",
    failures=(r"TypeError: .*(missing|unexpected)",),
    shims=(),
    side="worker",
    gate_covers=(GateCover("layer-call-extended", worker_probe,
                           "not a shim: the extra argument only carries a value when the checkpoint's config sets the "
                           "matching key, and the given checkpoint config (--model-config) sets none of them; the "
                           "runtime probe guards the rest",
                           _config_gated_and_unset,
                           f"the extras are config-gated ({', '.join(CONFIG_GATED)}) and --model-config leaves them unset"),),
    upstream=('DeepseekV2 decoder layers take llama_4_scaling when the config sets it (vLLM 0.12.0, seen by the'
              ' gate)'),
)
