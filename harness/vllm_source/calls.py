"""Where an expression of speculators' code lands in vLLM, and whether a call of it still fits.

Shared by the generic comparison (static.py) and the targeted checks (checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.vllm_source.facts import Fact
from harness.vllm_source.signatures import signature
from harness.vllm_source.tree import Tree
from harness.vllm_source.used_surface import Call


@dataclass
class Ref:
    """Where an expression of speculators' code lands in vLLM."""

    head: str  # the import it starts from, "vllm.v1.core.sched.scheduler:Scheduler"
    chain: str  # the rest, as speculators wrote it: "().schedule().total_num_scheduled_tokens"
    obj: Any  # the griffe object reached (None: not followed to the end)
    instance: bool = False  # obj is a class, and the value an instance of it
    bound: bool = False  # obj is a method reached through an instance (its self is not passed)
    steps: list = field(default_factory=list)  # (chain so far, owner, member, found object) per member read

    @property
    def symbol(self) -> str:
        return self.head + self.chain


def _keyword(tree: Tree, sig, kw: str) -> tuple[bool | None, str]:
    """Whether the callee takes keyword `kw`: a parameter of that name, or its `**kwargs` and then a use of it
    (harness.vllm_source.kwargs_fate: absorbed and never read is not accepted)."""
    p = sig.named(kw)
    if p is not None and p.kind != "positional-only":
        return True, "accepted"
    if not sig.takes_any_keyword:
        return False, "not accepted"
    if sig.fn is None:
        return True, "accepted by **kwargs (a constructor's fields: not followed)"
    from harness.vllm_source.kwargs_fate import fate

    found = fate(tree, sig.fn, kw)
    said = {True: "accepted", False: "not accepted", None: "undecided"}[found.used]
    return found.used, f"{said}: {found.how}"


def call_facts(tree: Tree, ref: Ref, call: Call, contract: str) -> list[Fact]:
    """Does `call` (keywords, positionals) still fit the signature of what it reaches?"""
    site = f"{call.module.rsplit('.', 1)[-1]}.py:{call.line}"
    sig = signature(tree, ref.obj, bound=ref.bound)
    if sig is None:
        return [Fact(contract, ref.symbol, "signature", "signature not readable statically", None, site=site)]
    facts = []
    for kw in call.keywords:
        ok, said = _keyword(tree, sig, kw)
        facts.append(
            Fact(
                contract,
                f"{ref.symbol}({kw}=)",
                "keyword",
                said,
                ok,
                "keyword-removed",
                sig.where,
                site,
                {"keyword": kw},
            )
        )
    positional = sig.positional
    fits = call.n_positional <= len(positional) or sig.takes_any_positional
    facts.append(
        Fact(
            contract,
            f"{ref.symbol}(<{call.n_positional} positional>)",
            "positional",
            f"{len(positional)} positional parameters",
            fits,
            "positional-changed",
            sig.where,
            site,
        )
    )
    passed = {p.name for p in positional[: call.n_positional]} | set(call.keywords)
    missing = [p for p in sig.params if p.required and p.kind not in ("*args", "**kwargs") and p.name not in passed]
    where = f"{sig.where.rsplit(':', 1)[0]}:{missing[0].line}" if missing and missing[0].line else sig.where
    facts.append(
        Fact(
            contract,
            f"{ref.symbol}(...)",
            "required",
            ", ".join(p.name for p in missing) or "none",
            not missing,
            "required-parameter-added",
            where,
            site,
            {"parameters": [p.name for p in missing]},
        )
    )
    return facts
