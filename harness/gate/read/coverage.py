"""Which contract owns which piece of speculators' vLLM surface, and which shim covers which finding.

Derived from the contract modules (`CONTRACT.gate_owns`, `gate_covers`, `gate_outside`): a shim covers a
finding only when its code handles that exact kind of change and what it needs is still there (e.g. the
kv-helpers shim aliases helpers that moved to one of `kvhelpers.NEW_HOMES`, so a helper that moved anywhere
else is a finding no shim covers: NEEDS-NEW-SHIM). `validate()` checks that every covering function is one of
its contract's shims (C-layer's guard excepted: it has no shim).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

from harness import contracts
from harness.contracts import layer
from harness.contracts.base import GateCover
from harness.vllm_source.facts import RUNTIME, SURFACE, Finding

#: (import symbol glob, chain after it or None for any, contract): the first matching row owns a fact; anything
#: else is SURFACE (used vLLM API outside every contract).
OWNERS: tuple[tuple[str, str | None, str], ...] = tuple(
    (glob, chain, m.CONTRACT.id) for m in contracts.modules() for glob, chain in m.CONTRACT.gate_owns
)


def owner(head: str, chain: str) -> str:
    for pattern, wanted_chain, contract in OWNERS:
        if fnmatch.fnmatchcase(head, pattern) and (wanted_chain is None or chain == wanted_chain):
            return contract
    return SURFACE


#: Contracts no reading of vLLM's Python sources can decide, with why. The gate lists them as not
#: checked (with the dynamic hook's answer) instead of passing them silently; a contract that is
#: neither checked nor listed here makes the gate undecided.
OUTSIDE: dict[str, str] = {
    m.CONTRACT.id: m.CONTRACT.gate_outside for m in contracts.modules() if m.CONTRACT.gate_outside
}


@dataclass(frozen=True)
class Cover:
    """A contract's GateCover with the contract it belongs to."""

    contract: str
    cover: GateCover

    kind = property(lambda self: self.cover.kind)
    shim = property(lambda self: self.cover.shim)  # dotted name of the code that restores the contract
    reason = property(lambda self: self.cover.reason)
    condition = property(lambda self: self.cover.condition)

    @property
    def when(self) -> Callable[[Finding], bool]:
        return self.cover.when


COVERS: tuple[Cover, ...] = tuple(Cover(m.CONTRACT.id, c) for m in contracts.modules() for c in m.CONTRACT.gate_covers)


def attach_checkpoint_config(findings: list[Finding], config: dict) -> None:
    """Give config-gated findings the target checkpoint's values for the keys that gate them."""
    for f in findings:
        if f.contract == "layer":
            f.detail["checkpoint_config"] = {key: config.get(key) for key in layer.CONFIG_GATED.values()}


def needs_model_config(finding: Finding) -> bool:
    """A config-gated finding no source can decide: whether it matters depends on the target checkpoint's
    config, and none was given (--model-config)."""
    extras = set(finding.detail.get("not_passed_by_speculators", ()))
    return (
        finding.contract == "layer"
        and finding.kind == "layer-call-extended"
        and bool(extras)
        and extras <= set(layer.CONFIG_GATED)
        and "checkpoint_config" not in finding.detail
    )


MODEL_CONFIG_HINT = (
    "depends on the target checkpoint's config ({keys}); pass --model-config /path/to/config.json to decide"
)


def cover(finding: Finding) -> Cover | None:
    """The shim that covers `finding`, or None (NEEDS-NEW-SHIM)."""
    return next(
        (c for c in COVERS if c.contract == finding.contract and c.kind == finding.kind and c.when(finding)), None
    )


def uncovered_reason(finding: Finding) -> str:
    if finding.detail.get("why"):  # the check that made the fact says what no shim restores
        return finding.detail["why"]
    near = [c for c in COVERS if c.contract == finding.contract and c.kind == finding.kind]
    if near:
        return f"{near[0].shim} handles this kind of change only when {near[0].condition}"
    extra = finding.detail.get("not_passed_by_speculators")
    if extra:
        return (
            f"the stack's own loop passes {', '.join(extra)} to each layer, speculators' patched loop does not; "
            f"no shim restores that"
        )
    return f"no shim handles a {finding.kind} change in {finding.contract}"


def validate(contract_ids: list[str]) -> list[str]:
    """Problems with the table: unknown contract ids, covering code that is not one of the contract's shims."""
    known = set(contract_ids) | {SURFACE, RUNTIME}
    problems = [f"unknown contract {c!r} in OWNERS" for _, _, c in OWNERS if c not in known]
    problems += [f"unknown contract {c.contract!r} in COVERS" for c in COVERS if c.contract not in known]
    problems += [f"unknown contract {c!r} in OUTSIDE" for c in OUTSIDE if c not in known]
    by_id = contracts.by_id()
    for c in COVERS:
        shims = [s.fn for s in by_id[c.contract].CONTRACT.shims] if c.contract in by_id else []
        if shims and c.cover.fn not in shims:
            problems.append(f"{c.shim} covers a {c.kind} change of {c.contract} but is not one of its shims")
    return problems
