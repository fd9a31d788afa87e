"""C-kimistack: the decoder stack speculators patches is `model.model`.

`KimiK25ForConditionalGeneration` has no `.model`: its DeepseekV2 stack is
`model.language_model` (vLLM 0.15) or `model.language_model.model` (0.16+), so speculators'
`base_model = model.model` raises AttributeError. Shim (in the worker): find the stack by its
layers and alias it as `model.model` on the instance (not registered as a submodule, so weights
and state dicts are unchanged). Not applicable to models that have `.model`.
"""

from __future__ import annotations

from harness.contracts.base import Attach, Contract, GateCover, Observation, Shim


CANDIDATES = ("model", "language_model.model", "language_model")


def _walk(model, path: str):
    """The module at dotted `path` under `model`, or None where a part is missing."""
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def stack_path(model) -> str | None:
    """The first of CANDIDATES under `model` that holds `.layers`."""
    return next((path for path in CANDIDATES if hasattr(_walk(model, path), "layers")), None)


def decoder_stack(model):
    """The module holding the decoder layers (model.model, or Kimi-K2.5's language model stack)."""
    path = stack_path(model)
    if path is None:
        raise AttributeError(f"{type(model).__name__} has no decoder stack with .layers")
    return _walk(model, path)


def apply_worker(worker) -> bool:
    """Alias the loaded model's decoder stack as `model.model`, where speculators looks for it."""
    return alias_stack(worker.model_runner.model)


def alias_stack(model) -> bool:
    if "model" in model.__dict__ or _has(model, "model"):
        return False
    path = stack_path(model)
    if path is None:
        return False
    model.__dict__["model"] = _walk(model, path)
    return True


def _has(model, name: str) -> bool:
    try:
        model.__getattr__(name)
        return True
    except AttributeError:
        return False


def worker_probe(worker, layer_ids) -> dict:
    model = worker.model_runner.model
    alias = model.__dict__.get("model")
    facts = {"model": type(model).__name__, "stack_path": stack_path(model) if alias is None else "model (alias)"}
    if alias is None and _has(model, "model"):
        return {"not_applicable": f"{type(model).__name__} has .model", "facts": facts}
    model.__dict__.pop("model", None)  # undo the alias of the generator's own set-up: the unshimmed run needs it gone
    r = worker._harness_setup_attempts(layer_ids, CONTRACT.id)
    r["facts"] = facts
    return r


def probe(ctx) -> Observation:
    r = ctx.worker_call(worker_probe, ctx.layer_ids)
    if r.get("not_applicable"):
        from harness.contracts.base import Attempt

        return Observation(CONTRACT, Attempt(True), None, r["facts"], not_applicable=r["not_applicable"],
                           subject=ctx.model.family)
    return Observation.of(CONTRACT, r["unshimmed"], r["shimmed"], r["facts"],
                       subject=ctx.model.family)


CONTRACT = Contract(
    id="kimistack",
    assumes="the target model's decoder stack is model.model",
    failures=(r"has no attribute 'model'",),
    shims=(Shim(Attach.WORKER, apply_worker),),
    side="worker",
    gate_covers=(GateCover("stack-moved", apply_worker,
                           "finds the decoder stack at a known path and aliases it as model.model on the instance",
                           lambda f: f.detail.get("path") in CANDIDATES, f"the stack is at one of {', '.join(CANDIDATES)}"),),
    upstream='Kimi-K2.5 support (vLLM 0.16.0) keeps the decoder stack under language_model, not model',
)
