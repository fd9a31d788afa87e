"""Who settles what the static reading found: each watched path and each contract names the report rows whose
observation on the candidate decides it.

* a contract with a finding, unread facts or a changed watched path: its own row (per-model contracts on the gate's
  tiny model), its shim proof coming with it;
* the runtime path (worker and runner construction, device set-up, load, KV cache), the harness's own vLLM surface
  (`runtime`) and speculators' calls outside every contract (`surface`): the end-to-end extraction on the tiny model,
  which constructs, loads and runs exactly that code and compares the states with transformers;
* and always that extraction: whatever the reading found, the bump is judged by what speculators hands out.
"""

from __future__ import annotations

from harness.testing.rows import Wanted
from harness.vllm_source.facts import RUNTIME, SURFACE

#: The tiny model the gate observes the candidate on (the suite's default client model: a dense Llama).
MODEL = "tiny-llama"


def e2e_row(model: str = MODEL) -> str:
    return f"e2e[{model}]"


#: The watched paths and pseudo-contracts no contract row observes by itself: the rows that do.
PATH_OWNERS: dict[str, tuple[str, ...]] = {RUNTIME: (), SURFACE: ()}


def rows_of(cid: str, model: str = MODEL) -> tuple[str, ...]:
    """The report rows whose observation settles `cid` (a contract id, a watched path, or a pseudo-contract)."""
    from harness import contracts

    if cid in PATH_OWNERS:
        return (*PATH_OWNERS[cid], e2e_row(model))
    if cid in contracts.PER_MODEL:
        return (f"{cid}[{model}]", e2e_row(model))
    if cid in contracts.ids():
        return (cid, e2e_row(model))
    raise KeyError(f"no rows own {cid!r}: not a contract, a watched path or a pseudo-contract")


def unowned(paths: list[str]) -> list[str]:
    """The watched paths (`harness.gate.read.reach.WATCH`) no row settles: a unit test keeps this empty."""
    out = []
    for p in paths:
        try:
            rows_of(p)
        except KeyError:
            out.append(p)
    return out


def wanted(gate, model: str = MODEL) -> Wanted:
    """The rows the candidate must be observed on for this static reading: every contract with a finding, unread
    facts or an open watched-path change, and the end-to-end extraction on `model`."""
    touched = {f.contract for f in gate.findings} | set(gate.not_checked) | {c.contract for c in gate.unclassified}
    touched |= {cid for cid, s in gate.contracts.items() if s.get("status") not in ("unchanged", "outside")}
    touched |= set(gate.outside)  # what sources cannot show is observed whenever the candidate runs
    rows = {e2e_row(model)}
    for cid in touched:
        rows.update(rows_of(cid, model))
    return Wanted(frozenset(rows))
