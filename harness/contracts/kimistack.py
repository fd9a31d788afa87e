"""C-kimistack: the decoder stack speculators patches is `model.model`.

`KimiK25ForConditionalGeneration` has no `.model`: its DeepseekV2 stack is
`model.language_model` (vLLM 0.15) or `model.language_model.model` (0.16+), so speculators'
`base_model = model.model` raises AttributeError. Shim (in the worker): find the stack by its
layers and alias it as `model.model` on the instance (not registered as a submodule, so weights
and state dicts are unchanged). Not applicable to models that have `.model`.
"""

from __future__ import annotations

import ast

from harness.contracts.base import Attach, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import KIMI, not_found

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

        return Observation(
            CONTRACT, Attempt(True), None, r["facts"], not_applicable=r["not_applicable"], subject=ctx.model.subject
        )
    return Observation.of(CONTRACT, r["unshimmed"], r["shimmed"], r["facts"], subject=ctx.model.subject)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
def _assigned(init_node, attribute: str):
    for n in ast.walk(init_node):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == attribute and getattr(t.value, "id", "") == "self":
                    return n
    return None


def kimi_stack_path(tree, used, follower) -> list[Fact]:
    module, name, _ = KIMI
    symbol = f"{module}:{name}.model"
    if tree.module_file(module) is None:
        return [Fact(CONTRACT.id, symbol, "stack-path", "absent (no such model)", True)]
    cls = tree.lookup(f"{module}.{name}")
    init = tree.member(cls, "__init__") if cls is not None else None
    node = tree.node(init) if init is not None else None
    if node is None:
        return [not_found(CONTRACT.id, symbol, "stack-path", f"{name}.__init__")]
    own, lm = _assigned(node, "model"), _assigned(node, "language_model")
    if own is not None:
        path, line = "model", own.lineno
    elif lm is not None and isinstance(lm.value, ast.Call):
        callee = ast.unparse(lm.value.func)
        target = tree.lookup(f"{module}.{callee}")
        if target is not None and target.is_class and tree.member(target, "layers") is not None:
            path = "language_model"
        elif (target is not None and target.is_class and tree.member(target, "model") is not None) or callee.endswith(
            "init_vllm_registered_model"
        ):
            path = "language_model.model"  # a registered *ForCausalLM wrapper: its stack is .model
        else:
            path = None
        line = lm.lineno
    else:
        path, line = None, node.lineno
    if path is None:
        return [not_found(CONTRACT.id, symbol, "stack-path", "a recognisable decoder stack")]
    return [
        Fact(
            CONTRACT.id,
            symbol,
            "stack-path",
            path,
            path == "model",
            "stack-moved",
            tree.where(init, line),
            detail={"path": path},
        )
    ]


CONTRACT = Contract(
    id="kimistack",
    assumes="the target model's decoder stack is model.model",
    failures=(r"has no attribute 'model'",),
    shims=(Shim(Attach.WORKER, apply_worker),),
    side="worker",
    gate_covers=(
        GateCover(
            "stack-moved",
            apply_worker,
            "finds the decoder stack at a known path and aliases it as model.model on the instance",
            lambda f: f.detail.get("path") in CANDIDATES,
            f"the stack is at one of {', '.join(CANDIDATES)}",
        ),
    ),
    gate_checks=(kimi_stack_path,),
    upstream="Kimi-K2.5 support (vLLM 0.16.0) keeps the decoder stack under language_model, not model",
)
