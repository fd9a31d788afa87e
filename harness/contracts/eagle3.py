"""C-eagle3: `supports_eagle3(model)` holds for the target model.

speculators 0.3.0 refuses any model for which vLLM's `supports_eagle3()` is False ("does not
support hidden state extraction"). The check is a guard, not a need: the capture only needs the
decoder stack's layers, `start_layer`/`end_layer` and final norm (speculators 0.4.0 dropped the
check). vLLM adds SupportsEagle3 to DeepseekV2/V3 and Kimi-K2.5 in 0.18. Shim (in the worker):
accept a model whose stack has what the patched forward uses. Admitted or marked, states are handed out only where
speculators' replacement forward gives that model's own states: once the workers are set up, the generator runs
`admit` (C-forward's comparison on two fixed prompts) on every stack speculators' loop replaced, and a divergence
refuses every extraction (Gemma-2 on vLLM <= 0.17: its forward scales the embeddings; Cohere: its layers return
(output, input), not a residual to add).
"""

from __future__ import annotations

import ast

from harness.contracts import forward
from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import FAMILIES, KIMI, imported, not_found

STACK_ATTRS = ("layers", "start_layer", "end_layer", "norm")


def patchable(model) -> bool:
    from harness.contracts.kimistack import decoder_stack

    try:
        stack = decoder_stack(model)
    except AttributeError:
        return False
    return all(hasattr(stack, a) for a in STACK_ATTRS)


def accepting(model) -> bool:
    """Stands in for `supports_eagle3` in speculators' worker extension."""
    from vllm.model_executor.models.interfaces import supports_eagle3

    return bool(supports_eagle3(model)) or patchable(model)


def accept_patchable(ns: dict, current, worker) -> bool:
    """Stand `accepting` in for `supports_eagle3` in speculators' worker extension; engaged where vLLM's own
    check refuses the loaded model."""
    ns["supports_eagle3"] = accepting
    return not current("supports_eagle3")(worker.model_runner.model)


def patched_by_speculators(worker) -> bool:
    """Whether speculators' set-up replaced the stack's forward with its loop: every such stack needs the
    admission check, whether vLLM marks it SupportsEagle3 or the shim let it in (the mark says nothing about what
    speculators' loop computes: Cohere's states are wrong either way)."""
    return "forward" in forward.stack_of(worker).__dict__


def admission_prompts(vocab_size: int) -> list[list[int]]:
    """Fixed prompts for the admission check (C-forward's lengths; deterministic ids spread over the vocabulary)."""
    return [[(7 * i + 3 + 101 * n) % vocab_size for i in range(n)] for n in forward.PROMPT_TOKENS]


def admit(generator) -> str | None:
    """Run by the generator once its workers are set up: for a stack speculators' loop replaced, C-forward's check
    (the model's own forward against speculators' loop, on two fixed prompts); why every extraction is refused,
    or None."""
    call = generator.executor_view.real.collective_rpc
    if not call("_harness_call", args=(patched_by_speculators,))[0]:
        return None
    return forward.admission(generator, admission_prompts(generator.vocab_size))


def worker_probe(worker, layer_ids) -> dict:
    from vllm.model_executor.models.interfaces import supports_eagle3

    model = worker.model_runner.model
    r = worker._harness_setup_attempts(layer_ids, CONTRACT.id)
    r["facts"] = {
        "model": type(model).__name__,
        "supports_eagle3": bool(supports_eagle3(model)),
        "stack_patchable": patchable(model),
    }
    return r


def probe(ctx) -> Observation:
    r = ctx.worker_call(worker_probe, ctx.layer_ids)
    shimmed = r["shimmed"]
    if shimmed.ok and not r["facts"]["supports_eagle3"] and ctx.generator.refused:
        # admitted by the shim, refused by its admission check: speculators' loop is not this model's forward
        shimmed = Attempt.failed(forward.FAILURE, ctx.generator.refused)
    return Observation.of(CONTRACT, r["unshimmed"], shimmed, r["facts"], subject=ctx.model.subject)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
def _interface(tree, used, follower) -> str:
    """The class `supports_eagle3` tests with isinstance (read from its body)."""
    symbol = imported(used, "supports_eagle3")
    fn = follower.resolve_import(symbol) if symbol else None
    node = tree.node(fn) if fn is not None and fn.is_function else None
    for n in ast.walk(node) if node else ():
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance" and len(n.args) == 2:
            return ast.unparse(n.args[1]).rsplit(".", 1)[-1]
    return "SupportsEagle3"


def eagle3_support(tree, used, follower) -> list[Fact]:
    if not imported(used, "supports_eagle3"):
        return []
    interface = _interface(tree, used, follower)
    targets = [(m, lm, fam) for fam, (m, _, _, lm) in FAMILIES.items()] + [KIMI]
    facts = []
    for module, name, family in targets:
        symbol = f"{module}:{name}"
        cls = tree.lookup(f"{module}.{name}")
        if cls is None:
            if tree.module_file(module) is None and module == KIMI[0]:
                facts.append(Fact(CONTRACT.id, symbol, "interface", "absent (no such model)", True))
            else:
                facts.append(not_found(CONTRACT.id, symbol, "interface", name))
            continue
        has = interface in tree.base_names(cls)
        stack_module, stack = FAMILIES[family][0], FAMILIES[family][1]
        stack_cls = tree.lookup(f"{stack_module}.{stack}")
        missing = [a for a in STACK_ATTRS if stack_cls is None or tree.member(stack_cls, a) is None]
        facts.append(
            Fact(
                CONTRACT.id,
                symbol,
                "interface",
                interface if has else f"no {interface}",
                has,
                "interface-missing",
                tree.where(cls),
                detail={"stack_missing": missing},
            )
        )
    return facts


CONTRACT = Contract(
    id="eagle3",
    assumes="supports_eagle3(model) is True for the target model",
    failures=(r"Model \w+ does not support hidden state extraction",),
    shims=(Shim(Attach.WORKER_GLOBALS, accept_patchable),),
    side="worker",
    gate_owns=(("vllm.model_executor.models.interfaces:supports_eagle3", None),),
    gate_covers=(
        GateCover(
            "interface-missing",
            accept_patchable,
            f"accepts a model without SupportsEagle3 whose decoder stack has {', '.join(STACK_ATTRS)}",
            lambda f: not f.detail.get("stack_missing"),
            "the decoder stack still has those attributes",
        ),
    ),
    gate_checks=(eagle3_support,),
    upstream=(
        "vLLM 0.18.0 added SupportsEagle3 to DeepseekV2/V3 and Kimi-K2.5; before, supports_eagle3() refuses them"
    ),
)
