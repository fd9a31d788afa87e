"""Targeted static checks: the contracts about behaviour, defaults and return shapes, read from source.

The used surface shows names and keywords; these read what a signature cannot: what
`collective_rpc(unique_reply_rank=)` returns, whether the runner is two-phase, a field's default,
which interface a model class implements, where Kimi-K2.5 keeps its decoder stack, what the
stack's own loop passes to each layer. Each check lives in its contract's module (`CONTRACT.gate_checks`);
here they are run in registry order. Each applies only where speculators' surface uses the thing it reads,
and answers `holds=None` (not checked) rather than guess when it cannot find what it reads.
"""

from __future__ import annotations

from harness import contracts
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import FAMILIES, KIMI


def seed_modules(used) -> set[str]:
    """Modules to load from the start (more are loaded as lookups ask for them)."""
    from harness.contracts.memory import PLATFORM

    seeds = {s.split(":")[0] for s in used.imported_symbols()}
    seeds |= {m for m, *_ in FAMILIES.values()} | {KIMI[0], PLATFORM[0]}
    return seeds


def run_all(tree, used, follower) -> list[Fact]:
    return [
        fact for m in contracts.modules() for check in m.CONTRACT.gate_checks for fact in check(tree, used, follower)
    ]
