"""C-embed: the decoder stack has `get_input_embeddings(input_ids)`.

speculators' patched forward embeds token ids with `self.get_input_embeddings(input_ids)`. vLLM
0.11.1 renamed the method on the inner models to `embed_input_ids` (no reverse alias), so every
text-only prefill raises AttributeError inside the worker. Shim (in the worker): alias
`get_input_embeddings` to `embed_input_ids` on the stack instance when only the new name exists.
"""

from __future__ import annotations

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import FAMILIES, not_found


def needed(stack) -> bool:
    return not _has_own(stack, "get_input_embeddings") and hasattr(stack, "embed_input_ids")


def _has_own(stack, name: str) -> bool:
    try:
        getattr(type(stack), name)
        return True
    except AttributeError:
        return False


def apply_worker(worker) -> bool:
    """Alias `get_input_embeddings` on the decoder stack speculators' capture set-up found (`model.model`)."""
    return alias_embeddings(worker.model_runner.model.model)


def alias_embeddings(stack) -> bool:
    if not needed(stack):
        return False
    stack.__dict__["get_input_embeddings"] = stack.embed_input_ids
    return True


def worker_probe(worker) -> dict:
    """Runs inside a vLLM worker (sent as an RPC)."""
    import torch

    from harness.contracts.kimistack import decoder_stack

    stack = decoder_stack(worker.model_runner.model)
    ids = torch.tensor([1, 2, 3], device=next(stack.parameters()).device)
    alias = stack.__dict__.pop("get_input_embeddings", None)
    try:
        unshimmed, _ = Attempt.run(lambda: stack.get_input_embeddings(ids))
    finally:
        if alias is not None:
            stack.__dict__["get_input_embeddings"] = alias
    shimmed, out = Attempt.run(lambda: (alias_embeddings(stack), stack.get_input_embeddings(ids))[1])
    facts = {
        "stack": type(stack).__name__,
        "has_get_input_embeddings": _has_own(stack, "get_input_embeddings"),
        "has_embed_input_ids": hasattr(stack, "embed_input_ids"),
    }
    if out is not None and hasattr(stack, "embed_input_ids"):
        facts["alias_equals_embed_input_ids"] = bool(torch.equal(out, stack.embed_input_ids(ids)))
    return {"unshimmed": unshimmed, "shimmed": shimmed, "facts": facts}


def probe(ctx) -> Observation:
    r = ctx.worker_call(worker_probe)
    return Observation.of(CONTRACT, r["unshimmed"], r["shimmed"], r["facts"], subject=ctx.model.subject)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
OLD_EMBED, NEW_EMBED = "get_input_embeddings", "embed_input_ids"


def embed_method(tree, used, follower) -> list[Fact]:
    if not used.calls_named("self." + OLD_EMBED):
        return []
    facts = []
    for module, stack, *_ in FAMILIES.values():
        symbol = f"{module}:{stack}.{OLD_EMBED}"
        cls = tree.lookup(f"{module}.{stack}")
        if cls is None:
            facts.append(not_found(CONTRACT.id, symbol, "method", stack))
            continue
        old, new = tree.member(cls, OLD_EMBED), tree.member(cls, NEW_EMBED)
        value = OLD_EMBED if old is not None else f"{NEW_EMBED} only" if new is not None else "neither"
        facts.append(
            Fact(
                CONTRACT.id,
                symbol,
                "method",
                value,
                old is not None,
                "method-renamed",
                tree.where(old or new or cls),
                detail={"new_name": NEW_EMBED if new is not None else None},
            )
        )
    return facts


CONTRACT = Contract(
    id="embed",
    assumes="the decoder stack (model.model) has get_input_embeddings(input_ids)",
    failures=(r"has no attribute 'get_input_embeddings'",),
    shims=(Shim(Attach.WORKER_AFTER, apply_worker),),
    side="worker",
    gate_covers=(
        GateCover(
            "method-renamed",
            apply_worker,
            "aliases get_input_embeddings to embed_input_ids on the stack instance",
            lambda f: f.detail.get("new_name") == "embed_input_ids",
            "the stack has embed_input_ids",
        ),
    ),
    gate_checks=(embed_method,),
    upstream="vLLM #27583 renamed get_input_embeddings to embed_input_ids (0.11.1); #30469 removed the fallback",
)
