"""What the gate observes in one vLLM version (facts) and what changed between two (findings). Data only.

A fact is one thing speculators (or one of the harness's shims) relies on, as one version shows
it: `holds` says whether speculators' assumption holds there (None: it could not be checked). Two
versions' facts with the same key are compared; a fact that stops holding, or changes while not
holding, becomes a finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fact:
    contract: str  # contract id (harness.contracts), or SURFACE for used vLLM API no contract covers
    symbol: str  # what is relied on, named the same way in every version
    check: str  # what was looked at: "import", "keyword", "required", "return-shape", ...
    value: str  # what this version shows, as text
    holds: bool | None  # speculators' assumption holds in this version; None: could not be checked
    kind: str | None = None  # the kind of change when it does not hold ("import-moved", ...)
    evidence: str | None = None  # file:line in this version's sources
    site: str | None = None  # speculators' own line that relies on it
    detail: dict = field(default_factory=dict, hash=False, compare=False)  # what coverage rules read

    @property
    def key(self) -> tuple:
        return (self.contract, self.symbol, self.check, self.site)


#: Pseudo-contract for vLLM API speculators uses that none of the harness's contracts is about.
SURFACE = "surface"
#: Pseudo-contract for the vLLM surface of the harness's runtime (worker extension, executor view, transport),
#: which no one contract owns (`harness.vllm_source.shim_surface`).
RUNTIME = "runtime"


@dataclass
class Finding:
    contract: str
    symbol: str
    kind: str
    old: str
    new: str
    evidence: str | None  # in the new source
    site: str | None = None
    detail: dict = field(default_factory=dict)
    status: str = "uncovered"  # "covered" | "accepted" (allow-list) | "uncovered"
    shim: str | None = None
    reason: str | None = None  # why the shim covers it, or why the allow-list accepts it

    @classmethod
    def between(cls, old: Fact | None, new: Fact) -> Finding:
        return cls(
            new.contract,
            new.symbol,
            new.kind or new.check,
            old.value if old else "(not seen)",
            new.value,
            new.evidence,
            new.site,
            dict(new.detail),
        )
