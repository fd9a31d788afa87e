"""C-layer: decoder layers take `layer(hidden_states=, positions=, residual=)` and return (hidden, residual).

speculators' patched forward replaces the stack's own loop and calls each layer with exactly those
three keywords. Anything else the stack's own loop passes is lost: DeepseekV2's layer gained
`llama_4_scaling` in vLLM 0.12, which its own forward computes when the checkpoint's config sets
`llama_4_scaling`. For such a checkpoint the patched loop silently diverges; no shim restores it
(the contract is then broken). Observed on the loaded layers, in the worker.
"""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

from harness.contracts.base import Attempt, Contract, GateCover, Observation
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import FAMILIES, not_found

PASSED = ("hidden_states", "positions", "residual")
#: Layer parameters the stack's own loop passes but whose value only matters when the checkpoint's
#: config sets the named key; the probe fails the contract for such a checkpoint (no shim).
CONFIG_GATED = {"llama_4_scaling": "llama_4_scaling"}


def worker_probe(worker) -> dict:
    from harness.contracts.kimistack import decoder_stack

    stack = decoder_stack(worker.model_runner.model)
    layers = list(stack.layers)[stack.start_layer : stack.end_layer]
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
    config = (
        getattr(worker.model_runner.model_config, "hf_text_config", None) or worker.model_runner.model_config.hf_config
    )
    facts: dict[str, Any] = {"layers": kinds}
    for param, key in CONFIG_GATED.items():
        value = getattr(config, key, None)
        facts[f"config_{key}"] = value
        if failure is None and value and any(param in k["not_passed"] for k in kinds.values()):
            failure = Attempt.failed(
                "SilentDivergence", f"the stack passes {param} (set in this config); speculators' patched loop does not"
            )
    return {"unshimmed": failure or Attempt(True), "facts": facts}


#: How Python words a call that does not fit a signature, after the callee's name (`Cls.forward() got ...`).
_MISFIT = re.compile(
    r"(?P<cls>\w+)\.forward\(\) (?P<why>got an unexpected keyword argument '\w+'|missing \d+ required \w+ "
    r"arguments?: [^|@]*?|takes \d+ positional arguments? but \d+ (?:were|was) given)(?=['\s|@]|$)"
)


def start_cause(failure: str, model) -> Attempt | None:
    """Whether a generator's failed start was speculators' layer call not fitting a layer's forward: the failure
    names the class (`GraniteDecoderLayer.forward() got an unexpected keyword argument 'residual'`), and binding
    speculators' keywords to that class's own signature in this vLLM fails the same way. The root row of a start
    that failed so; None where the failure says something else or the named class does not confirm it."""
    found = _MISFIT.search(failure or "")
    layer_cls = found and _model_module_member(model.architecture, found["cls"])
    if not found or layer_cls is None:
        return None
    sig = inspect.signature(layer_cls.forward)
    try:
        sig.bind(None, **{p: None for p in PASSED})
    except TypeError:
        shown = "(" + ", ".join(str(p).split(":")[0] for n, p in sig.parameters.items() if n != "self") + ")"
        return Attempt.failed(
            "TypeError",
            f"speculators' loop calls each layer with {', '.join(f'{p}=' for p in PASSED)}; "
            f"{found['cls']}.forward{shown} does not take that call: {found['why']}",
        )
    return None


def _model_module_member(architecture: str, name: str):
    """`name` in the vLLM module that defines `architecture` (its decoder layer class), or None."""
    import importlib

    from vllm.model_executor.models import ModelRegistry

    entry = getattr(ModelRegistry, "models", {}).get(architecture)
    module = getattr(entry, "module_name", None) or getattr(getattr(entry, "model_cls", None), "__module__", None)
    try:
        return getattr(importlib.import_module(module), name, None) if module else None
    except ImportError:
        return None


def probe(ctx) -> Observation:
    r = ctx.worker_call(worker_probe)
    return Observation(CONTRACT, r["unshimmed"], None, r["facts"], subject=ctx.model.subject)


def _config_gated_and_unset(finding) -> bool:
    """The gate's finding names only config-gated extras, and the given checkpoint config sets none of them."""
    extras = set(finding.detail.get("not_passed_by_speculators", ()))
    cfg = finding.detail.get("checkpoint_config")
    return extras <= set(CONFIG_GATED) and cfg is not None and not any(cfg.get(CONFIG_GATED[k]) for k in extras)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
def _passed(call: ast.Call) -> list[str]:
    names = [a.id if isinstance(a, ast.Name) else ast.unparse(a) for a in call.args]
    return names + [k.arg or "**" + ast.unparse(k.value) for k in call.keywords]


def layer_calls(tree, used, follower) -> list[Fact]:
    from harness.vllm_source.calls import Ref, call_facts

    spec_calls = used.calls_named("layer")
    if not spec_calls:
        return []
    passes = set(spec_calls[0].keywords)
    facts = []
    for module, stack, layer_cls, _ in FAMILIES.values():
        forward = tree.member(tree.lookup(f"{module}.{stack}"), "forward")
        node = tree.node(forward) if forward is not None else None
        layer_fwd = tree.member(tree.lookup(f"{module}.{layer_cls}"), "forward")
        if node is None or layer_fwd is None:
            facts.append(not_found(CONTRACT.id, f"{module}:{stack}.forward", "layer-call", f"{stack}/{layer_cls}"))
            continue
        own = [n for n in ast.walk(node) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "layer"]
        if not own:
            facts.append(not_found(CONTRACT.id, f"{module}:{stack}.forward", "layer-call", "layer(...) call"))
            continue
        passed = _passed(own[0])
        # `**kwargs` the stack's forward only forwards from its own caller are not values the stack
        # computes; were any passed, speculators' replacement forward would refuse them loudly.
        forwarded = {f"**{p.name}" for p in forward.parameters if p.kind.value == "variadic keyword"}
        extra = sorted(set(passed) - passes - forwarded)
        facts.append(
            Fact(
                CONTRACT.id,
                f"{module}:{stack}.forward",
                "layer-call",
                ", ".join(passed),
                not extra,
                "layer-call-extended",
                tree.where(forward, own[0].lineno),
                detail={"not_passed_by_speculators": extra},
            )
        )
        ref = Ref(f"{module}:{layer_cls}", "().forward", layer_fwd, bound=True)
        for call in spec_calls:
            facts += call_facts(tree, ref, call, CONTRACT.id)
    return facts


CONTRACT = Contract(
    id="layer",
    assumes="layer(hidden_states=, positions=, residual=) is the whole call the stack's own loop makes",
    failures=(r"TypeError: .*(missing|unexpected|positional)",),
    broken_says="speculators' fault: its loop's layer call does not fit this model's layers",
    shims=(),
    side="worker",
    gate_covers=(
        GateCover(
            "layer-call-extended",
            worker_probe,
            "not a shim: the extra argument only carries a value when the checkpoint's config sets the "
            "matching key, and the given checkpoint config (--model-config) sets none of them; the "
            "runtime probe guards the rest",
            _config_gated_and_unset,
            f"the extras are config-gated ({', '.join(CONFIG_GATED)}) and --model-config leaves them unset",
        ),
    ),
    gate_checks=(layer_calls,),
    upstream=("DeepseekV2 decoder layers take llama_4_scaling when the config sets it (vLLM 0.12.0, seen by the gate)"),
)
