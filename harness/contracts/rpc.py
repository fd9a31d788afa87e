"""C-rpc: `collective_rpc(method, unique_reply_rank=0)` returns a list holding rank 0's reply.

speculators reads `collective_rpc("_get_captured_states", unique_reply_rank=0)[0]`. From vLLM
0.11.1 a call with `unique_reply_rank` returns the reply itself, so `[0]` picks the first layer's
tensor and `if not aux_hidden_states` raises. Observed on a real multiprocess executor by sending
rank 0 a list shaped like speculators' reply. Shim (on the executor view speculators holds): wrap a
single reply in a list; which reply shape the executor has is learned by an echo RPC at start-up.
"""

from __future__ import annotations

import ast

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import not_found, site


def speculators_read(rpc, layers):
    """What speculators does with the reply (vllm_hidden_states_generator.generate)."""
    captured_states_list = rpc(echo, args=(layers,), unique_reply_rank=0)
    aux_hidden_states = captured_states_list[0]
    if not aux_hidden_states:
        raise RuntimeError("Failed to capture hidden states from worker")
    return len(aux_hidden_states)


def echo(worker, value):
    """RPC body used to learn how `collective_rpc` returns a single rank's reply (module level: picklable)."""
    return value


def reply_as_list(view, reply, unique_reply_rank):
    """speculators indexes `[0]` into a single-rank reply, written for the list-of-one of vLLM <= 0.11.0; where
    the executor returns the reply itself (learned by an echo RPC when the view starts), wrap it."""
    if unique_reply_rank is None or not view.single_reply:
        return reply
    return [reply]


def probe(ctx) -> Observation:
    import torch

    layers = [torch.ones(3, 8), torch.zeros(3, 8)]
    real = ctx.real_executor
    unshimmed, _ = Attempt.run(lambda: speculators_read(real.collective_rpc, layers))
    shimmed, n = Attempt.run(lambda: speculators_read(ctx.executor_view.collective_rpc, layers))
    raw = real.collective_rpc(echo, args=("marker",), unique_reply_rank=0)
    facts = {
        "executor": type(real).__name__,
        "reply_to_marker": repr(raw),
        "world_size": ctx.world_size,
        "shim_selected": ctx.executor_view.single_reply,
    }
    if n is not None:
        facts["layers_read_through_shim"] = n
    return Observation.of(CONTRACT, unshimmed, shimmed, facts)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
def _unwraps(value) -> bool:
    """`return replies[0]` (or either branch of a conditional doing so): one rank's reply, not the list."""
    if isinstance(value, ast.IfExp):
        return _unwraps(value.body) or _unwraps(value.orelse)
    return isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) and value.slice.value == 0


def rpc_return(tree, used, follower) -> list[Fact]:
    facts = []
    for call in (c for c in used.calls if "unique_reply_rank" in c.keywords):
        ref = follower.follow(call.module, call.callee)
        symbol = f"{ref.symbol if ref else call.callee}(unique_reply_rank=)"
        node = tree.node(ref.obj) if ref and ref.obj is not None and ref.obj.is_function else None
        if node is None:
            facts.append(not_found(CONTRACT.id, symbol, "return-shape", "collective_rpc"))
            continue
        returns = [r for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
        single = [r for r in returns if _unwraps(r.value)]
        listing = [r for r in returns if isinstance(r.value, ast.Name)]
        line = (single or listing or returns or [node])[0].lineno
        facts.append(
            Fact(
                CONTRACT.id,
                symbol,
                "return-shape",
                "single reply" if single else "list of replies",
                not single,
                "reply-unwrapped",
                tree.where(ref.obj, line),
                site(call),
            )
        )
    return facts


CONTRACT = Contract(
    id="rpc",
    assumes="collective_rpc(method, unique_reply_rank=0) returns [rank-0 reply]",
    failures=(r"Boolean value of Tensor with more than one value is ambiguous",),
    shims=(Shim(Attach.RPC_REPLY, reply_as_list),),
    gate_owns=(("vllm.v1.executor.multiproc_executor:MultiprocExecutor", "().collective_rpc"),),
    gate_covers=(
        GateCover(
            "reply-unwrapped",
            reply_as_list,
            "wraps rank 0's single reply in a list, as speculators indexes [0] (reply shape learned by an echo RPC)",
        ),
    ),
    gate_checks=(rpc_return,),
    upstream=(
        "vLLM 0.11.1's MultiprocExecutor.collective_rpc returns rank unique_reply_rank's reply itself, no"
        " longer a list of one"
    ),
)
