"""The gate's decision from observation: the candidate's rows, as a run of the suite observed them, decide.

The static reading says what changed; running the candidate says whether speculators still works. After a dynamic
run (or with `--use-reports`, from a complete report of the same build) the verdict is one of four, never REVIEW:

* BROKEN - a wanted row is broken on the candidate and not on the baseline, and no shim can restore it (the
  contract has none), or the end-to-end extraction on the tiny model gave other states than transformers;
* NEEDS-NEW-SHIM - a wanted row is broken on the candidate and not on the baseline, its contract has a shim, and the
  shim did not restore it;
* NEEDS-SHIM-AND-COVERED - every wanted row holds, some through a shim proven needed and sufficient on the
  candidate where the baseline did not need it (or there is no baseline to say);
* SAFE - every wanted row holds as it did on the baseline.

A wanted row the run did not observe leaves the gate UNDECIDED: never a verdict greener than the evidence. A row
broken on the baseline too (a known break, e.g. a model family speculators' loop cannot run) is listed and decides
nothing about the bump. The same rule judges a targeted run and the matrix's complete run of the same build, so the
two can be compared (a disagreement is a defect of one of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.reporting.report import PROOF_NEEDED

ORDER = ("SAFE", "NEEDS-SHIM-AND-COVERED", "NEEDS-NEW-SHIM", "BROKEN")


@dataclass
class Judged:
    """One wanted row as observed: its outcome on the candidate (and the baseline), what it says for the verdict."""

    row: str
    outcome: str  # native | shimmed | broken | n/a | pass | fail | not observed
    says: str  # one of ORDER, or "UNDECIDED"
    why: str
    baseline: str | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Observation:
    """What a run of the candidate observed of the wanted rows, and the verdict that follows."""

    source: str  # the report it was read from, or the run that wrote it
    rows: list[Judged] = field(default_factory=list)
    seconds: float | None = None
    error: str | None = None
    timings: dict = field(default_factory=dict)  # where the seconds went (env made, run)

    @property
    def verdict(self) -> str:
        if self.error or any(j.says == "UNDECIDED" for j in self.rows) or not self.rows:
            return "UNDECIDED"
        return max((j.says for j in self.rows), key=ORDER.index)

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "verdict": self.verdict,
            "seconds": self.seconds,
            "timings": self.timings,
            "error": self.error,
            "rows": [j.to_json() for j in self.rows],
        }


def row_outcomes(rep: dict) -> dict[str, dict]:
    """Every row of an env report by key: the contract rows as they are; the end-to-end checks folded into one row
    per model, `e2e[<model>]` (pass where every check that applies passed, fail where one failed)."""
    out: dict[str, dict] = {c["contract"]: c for c in rep.get("contracts", [])}
    by_model: dict[str, list[dict]] = {}
    for e in rep.get("e2e", []):
        by_model.setdefault(e["model"], []).append(e)
    for model, checks in by_model.items():
        applied = [e for e in checks if e["result"] not in ("n/a", "measured")]
        failed = [e for e in applied if e["result"] != "pass"]
        out[f"e2e[{model}]"] = {
            "outcome": "fail" if failed else "pass" if applied else "n/a",
            "reason": "; ".join(f"{e['check']}: {e.get('measured', '')}" for e in (failed or applied)[:3]),
        }
    return out


def _shim_of(row: str) -> bool | None:
    """Whether the row's contract has a shim (None: not a contract row)."""
    from harness import contracts

    module = contracts.by_id().get(row.split("[")[0])
    return None if module is None else bool(module.CONTRACT.shim)


def judge_row(row: str, seen: dict | None, before: dict | None) -> Judged:
    """One wanted row: what it says for the verdict, from the candidate's observation and the baseline's."""
    base = before["outcome"] if before else None
    if seen is None:
        return Judged(row, "not observed", "UNDECIDED", "the run did not observe this row", base)
    outcome, why = seen["outcome"], seen.get("reason") or ""
    if outcome in ("broken", "fail"):
        if base == outcome:
            return Judged(row, outcome, "SAFE", f"broken on the baseline too (not the bump's): {why}", base)
        has_shim = _shim_of(row)
        says = "NEEDS-NEW-SHIM" if has_shim else "BROKEN"
        return Judged(row, outcome, says, why, base)
    if outcome == "shimmed":
        proof = (seen.get("proof") or {}).get("result")
        if proof not in (PROOF_NEEDED, None, "n/a", "not run"):
            return Judged(row, outcome, "NEEDS-NEW-SHIM", f"the shim's proof: {proof}", base)
        says = "SAFE" if base == "shimmed" else "NEEDS-SHIM-AND-COVERED"
        return Judged(row, outcome, says, f"through {seen.get('shim')}" + (f" (proof: {proof})" if proof else ""), base)
    return Judged(row, outcome, "SAFE", why, base)


def judge(rows: list[str], candidate: dict, baseline: dict | None, source: str) -> Observation:
    """The wanted `rows` of the candidate's report judged against the baseline's report (None: no baseline)."""
    seen, before = row_outcomes(candidate), row_outcomes(baseline) if baseline else {}
    return Observation(source, [judge_row(r, seen.get(r), before.get(r)) for r in sorted(rows)])
