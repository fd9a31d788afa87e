"""From a comparison to a decision: each contract's status, the verdict and the exit code.

Verdicts, strongest first:

* UNDECIDED (exit 5) - a contract could not be checked (or the sources could not be had). Never
  hidden behind a pass: the contract is listed as not checked.
* BROKEN (exit 1) - an uncovered change in a contract that by its own statement no shim can
  restore (`CONTRACT.shim is None`, e.g. C-layer).
* NEEDS-NEW-SHIM (exit 1) - an uncovered change anywhere else.
* REVIEW (exit 3) - code on a watched path changed and no check classifies the change
  (`changed-unclassified`, `harness.gate.read.reach`): a reviewer reads the listed diffs, or `--dynamic` runs the
  candidate and observes the contract. Never SAFE while one is open.
* NEEDS-SHIM-AND-COVERED (exit 0) - changes, each covered by an existing shim (listed) or accepted
  by an active allow-list entry.
* SAFE (exit 0) - nothing speculators relies on changed.

Contracts in `coverage.OUTSIDE` are outside what sources can show; they are listed as not checked
(with the dynamic hook's answer) and do not decide the static verdict.

Its JSON and Markdown reports: `harness.gate.decide.report`.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
from dataclasses import dataclass, field

from harness.contracts import by_id
from harness.gate.decide.allowlist import Entry, apply
from harness.gate.read import coverage
from harness.gate.read.static import Comparison
from harness.vllm_source.facts import RUNTIME, SURFACE, Finding

EXIT = {"SAFE": 0, "NEEDS-SHIM-AND-COVERED": 0, "NEEDS-NEW-SHIM": 1, "BROKEN": 1, "UNDECIDED": 5, "REVIEW": 3}


@dataclass
class Gate:
    old: str
    new: str
    verdict: str = "UNDECIDED"
    error: str | None = None
    contracts: dict = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    carried: list[Finding] = field(default_factory=list)
    restored: list[Finding] = field(default_factory=list)
    not_checked: dict = field(default_factory=dict)
    outside: dict = field(default_factory=dict)
    expired: list[dict] = field(default_factory=list)
    #: Rows the candidate's own env observed worse than its expectations, for contracts speculators relies on.
    observed_worse: list[dict] = field(default_factory=list)
    #: Watched-path changes (harness.gate.read.reach): open ones, ones a targeted check classified, and per contract.
    unclassified: list = field(default_factory=list)
    classified: list = field(default_factory=list)
    #: Changes the neutral-edit rule classified (harness.gate.read.reach.neutral): listed, never open.
    neutral: list = field(default_factory=list)
    paths: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # speculators, surface, sources, allowlist file, timings
    #: The candidate observed on the rows that settle what the reading found (harness.gate.observe), or None.
    observation: dict | None = None
    #: The verdict of the static reading alone, kept beside the observed one.
    static_verdict: str | None = None

    @property
    def exit_code(self) -> int:
        return EXIT[self.verdict]

    @property
    def shims(self) -> list[str]:
        return sorted({f.shim for f in self.findings if f.status == "covered" and f.shim})


def decide(
    old: str,
    new: str,
    comparison: Comparison,
    contract_ids: list[str],
    entries: list[Entry],
    today: _dt.date,
    dynamic: dict | None,
    dynamic_reason: str,
    paths: tuple | None = None,
) -> Gate:
    gate = Gate(old, new, findings=comparison.findings, carried=comparison.carried, restored=comparison.restored)
    for f in gate.findings + gate.carried:
        _resolve(f)
    gate.expired = apply(gate.findings, entries, today)
    shimless = {cid for cid, m in by_id().items() if m.CONTRACT.shim is None}
    for cid in [*contract_ids, SURFACE, RUNTIME]:
        gate.contracts[cid] = _status(cid, gate, comparison, dynamic, dynamic_reason, shimless)
    gate.not_checked = {
        c: comparison.not_checked.get(c) or [s["note"]]
        for c, s in gate.contracts.items()
        if s["status"] == "not-checked"
    }
    gate.observed_worse = (dynamic or {}).get("worse", [])
    gate.verdict = _verdict(gate)
    _paths(gate, paths, dynamic, [e for e in entries if e.active(today)])
    if gate.unclassified and gate.verdict in ("SAFE", "NEEDS-SHIM-AND-COVERED"):
        gate.verdict = "REVIEW"
    return gate


def _resolve(f) -> None:
    """A finding covered by a shim, uncovered, or undecidable without the model's config."""
    c = coverage.cover(f)
    f.status, f.shim, f.reason = (
        ("covered", c.shim, c.reason) if c else ("uncovered", None, coverage.uncovered_reason(f))
    )
    if not c and coverage.needs_model_config(f):
        keys = ", ".join(f.detail.get("not_passed_by_speculators", ()))
        f.status, f.reason = "needs-model-config", coverage.MODEL_CONFIG_HINT.format(keys=keys)


def _verdict(gate: Gate) -> str:
    """The verdict before the watched paths are read: the worst contract status decides."""
    statuses = {c["status"] for c in gate.contracts.values()}
    if gate.observed_worse:
        return "BROKEN"  # the candidate's own env observed it: no static reading overrides that
    if "not-checked" in statuses:
        return "UNDECIDED"
    if "broken" in statuses:
        return "BROKEN"
    if "needs-new-shim" in statuses:
        return "NEEDS-NEW-SHIM"
    return "NEEDS-SHIM-AND-COVERED" if gate.findings else "SAFE"


def _paths(gate: Gate, paths: tuple | None, dynamic: dict | None, entries: list[Entry]) -> None:
    """Sort the watched paths' changes: classified by a targeted check or accepted by an active allow-list entry
    whose pattern globs the function (`module:Class.method`), compatible (optional parameters only), observed by
    the candidate's env (`--dynamic`), or open."""
    if paths is None:
        return
    changes, reached = paths
    for c in changes:
        entry = next((e for e in entries if fnmatch.fnmatchcase(c.key, e.pattern)), None)
        if entry is not None and not c.classified_by:
            c.classified_by = f"allow-list {entry.pattern!r} until {entry.expires}: {entry.reason}"
    observed = set((dynamic or {}).get("contracts", {})) - {w["contract"] for w in gate.observed_worse}
    for cid in reached:
        gate.paths[cid] = _path_of(gate, cid, [c for c in changes if cid in c.contracts], reached[cid], observed)


def _path_of(gate: Gate, cid: str, mine: list, reached: dict, observed: set) -> dict:
    """One contract's watched path: its open changes join the gate's unclassified, its classified ones the
    classified; the counts."""
    is_open = [
        c for c in mine if c.kind not in ("compatible", "neutral") and not c.classified_by and cid not in observed
    ]
    gate.unclassified += [c for c in is_open if c not in gate.unclassified]
    gate.classified += [c for c in mine if c.classified_by and c not in gate.classified]
    gate.neutral += [c for c in mine if c.kind == "neutral" and not c.classified_by and c not in gate.neutral]
    return {
        "reached": reached,
        "unclassified": len(is_open),
        "classified": sum(bool(c.classified_by) for c in mine),
        "compatible": sum(c.kind == "compatible" for c in mine),
        "neutral": sum(c.kind == "neutral" for c in mine),
        "observed": cid in observed and bool(mine),
    }


def _status(
    cid: str, gate: Gate, comparison: Comparison, dynamic: dict | None, dynamic_reason: str, shimless: set[str]
) -> dict:
    mine = [f for f in gate.findings if f.contract == cid]
    shims = sorted({f.shim for f in mine if f.shim})
    if cid in coverage.OUTSIDE:
        outside = _outside(cid, gate, comparison, dynamic, dynamic_reason, bool(mine))
        if outside is not None:
            return outside
        # What the sources do show of it (the runner its shims read) changed or could not be read: judged below,
        # as any contract is; the part outside the sources stays listed.
    undecidable = [f for f in mine if f.status == "needs-model-config"]
    if undecidable:
        return {"status": "not-checked", "findings": len(mine), "shims": shims, "note": undecidable[0].reason}
    if cid in comparison.not_checked:
        return {
            "status": "not-checked",
            "findings": len(mine),
            "shims": shims,
            "note": "; ".join(comparison.not_checked[cid][:3]),
        }
    if cid not in comparison.checked:
        return {
            "status": "not-checked",
            "findings": 0,
            "shims": [],
            "note": "no static check reads this contract from vLLM's sources",
        }
    open_ = [f for f in mine if f.status == "uncovered"]
    if open_:
        status = "broken" if cid in shimless else "needs-new-shim"
        return {"status": status, "findings": len(mine), "shims": shims, "note": open_[0].reason}
    return {
        "status": "covered" if mine else "unchanged",
        "findings": len(mine),
        "shims": shims,
        "note": _tally(gate, cid),
    }


def _tally(gate: Gate, cid: str) -> str:
    carried = sum(f.contract == cid for f in gate.carried)
    restored = sum(f.contract == cid for f in gate.restored)
    parts = (
        f"{carried} carried from {gate.old}" if carried else "",
        f"{restored} no longer needed" if restored else "",
    )
    return ", ".join(x for x in parts if x)


def _outside(cid: str, gate: Gate, comparison: Comparison, dynamic: dict | None, dynamic_reason: str, found: bool):
    """A contract the sources cannot fully show (coverage.OUTSIDE): listed with what --dynamic said of it; its
    status "outside" where nothing the sources do show of it changed or went unread (None: judged as any other)."""
    answer = (dynamic or {}).get("contracts", {}).get(cid)
    gate.outside[cid] = {"reason": coverage.OUTSIDE[cid], "dynamic": answer or dynamic_reason}
    if found or cid in comparison.not_checked:
        return None
    checked = comparison.checked.get(cid, 0)
    note = f"not checked statically: {coverage.OUTSIDE[cid]}; dynamic: {answer or dynamic_reason}"
    return {
        "status": "outside",
        "findings": 0,
        "shims": [],
        "note": (f"{checked} static fact(s) unchanged; " if checked else "") + note,
    }


def apply_observation(gate: Gate, obs) -> None:
    """The observation decides (harness.gate.decide.observed): the verdict becomes the observed one, never REVIEW;
    UNDECIDED where the run could not observe every wanted row, or where a finding depends on the target's config
    (a tiny model cannot show it). The static verdict and findings stay in the report beside it."""
    gate.static_verdict = gate.verdict
    gate.observation = obs.to_json()
    config_gated = any(f.status == "needs-model-config" for f in gate.findings)
    shimmed_change = any(f.status in ("covered", "accepted") for f in gate.findings)
    # A change the reading found and a shim covers, observed to hold: still a change the shims carry.
    observed = "NEEDS-SHIM-AND-COVERED" if obs.verdict == "SAFE" and shimmed_change else obs.verdict
    gate.verdict = "UNDECIDED" if config_gated else observed
    if obs.verdict != "UNDECIDED":  # every open change was on a path whose owning rows were observed
        for path in gate.paths.values():
            path["observed"] = True
    for cid, entry in gate.outside.items():
        seen = [j for j in obs.rows if j.row.split("[")[0] == cid]
        if seen:
            entry["dynamic"] = ", ".join(f"{j.row}: {j.outcome}" for j in seen)


def undecided(old: str, new: str, error: str, meta: dict | None = None) -> Gate:
    return Gate(old, new, "UNDECIDED", error=error, meta=meta or {})
