"""Which tests observe which rows of an env report, so that a run can be narrowed to the rows that are wanted.

Two callers narrow a run this way:
- row completion (`harness run --complete`): a build's complete report predates rows the suite has gained since
  (a contract added, a tiny-model fixture added); only the tests that observe those rows run, and their report is
  folded into the build's column with per-row provenance (`harness.reporting.matrix`);
- the gate's targeted dynamic decision: only the tests that observe the contracts owning a changed path run on the
  candidate.

A test's rows are read from its parameters, never from its name: `cid` (a contract, per model where a model is
given too), `key` (a shim proof's row), `run` (the end-to-end suite's generator of one model: the row
`e2e[<model>]`), and a model alone (`name`: that model's native, client and whose-fault rows, wanted where the whole
model is). A test with no such parameter observes no single row (the soak, bad input, the entry point) and is left
out of a narrowed run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The pytest options a narrowed run is given (comma-separated lists).
ROWS_OPTION = "--harness-only-rows"
MODELS_OPTION = "--harness-only-models"


@dataclass(frozen=True)
class Wanted:
    """The rows a narrowed run must observe: contract rows ("moeorder", "forward[tiny-llama]") and whole models
    (every row of a tiny model the report has none of)."""

    rows: frozenset[str] = field(default_factory=frozenset)
    models: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.rows or self.models)

    def args(self) -> list[str]:
        """The pytest arguments that narrow a run to these rows."""
        out = []
        if self.rows:
            out.append(f"{ROWS_OPTION}={','.join(sorted(self.rows))}")
        if self.models:
            out.append(f"{MODELS_OPTION}={','.join(sorted(self.models))}")
        return out

    def describe(self) -> str:
        parts = []
        if self.models:
            parts.append("every row of " + ", ".join(sorted(self.models)))
        if self.rows:
            parts.append(", ".join(sorted(self.rows)))
        return "; ".join(parts) or "nothing"


def from_options(config) -> Wanted | None:
    """The rows a run was narrowed to by its options, or None where it was not narrowed."""

    def split(name: str) -> frozenset[str]:
        value = config.getoption(name, default=None) or ""
        return frozenset(x for x in value.split(",") if x)

    wanted = Wanted(split(ROWS_OPTION), split(MODELS_OPTION))
    return wanted if wanted else None


def model_of(params: dict) -> str | None:
    return params.get("name") or params.get("run")


def observes(params: dict, wanted: Wanted) -> bool:
    """Whether a test with these parameters observes a wanted row."""
    model = model_of(params)
    if model is not None and model in wanted.models:
        return True
    if "key" in params:  # a shim proof's row: "moeorder", "embed[tiny-llama]"
        key = params["key"]
        return key in wanted.rows or ("[" in key and key.split("[", 1)[1].rstrip("]") in wanted.models)
    if "cid" in params:
        return (f"{params['cid']}[{model}]" if model else params["cid"]) in wanted.rows
    if "run" in params:  # the end-to-end suite's shared generator of one model: its rows are e2e[<model>]
        return f"e2e[{params['run']}]" in wanted.rows
    return False


def narrow(items: list, wanted: Wanted) -> tuple[list, list]:
    """(kept, deselected) of pytest `items`, kept in their order."""
    kept: list = []
    dropped: list = []
    for item in items:
        params = dict(getattr(getattr(item, "callspec", None), "params", {}) or {})
        (kept if observes(params, wanted) else dropped).append(item)
    return kept, dropped


def missing(report: dict, keys: list[str], models: tuple[str, ...]) -> Wanted:
    """What a build's complete report lacks against the suite as it is now: each contract row in `keys` it has
    no row for, and each model in `models` it has no row of at all (a fixture added since)."""
    have = {c["contract"] for c in report.get("contracts", [])}
    seen_models = {
        c["contract"].split("[", 1)[1].rstrip("]") for c in report.get("contracts", []) if "[" in c["contract"]
    }
    seen_models |= {e["model"] for e in report.get("e2e", [])}
    new_models = frozenset(m for m in models if m not in seen_models)
    rows = frozenset(k for k in keys if k not in have and not any(k.endswith(f"[{m}]") for m in new_models))
    return Wanted(rows, new_models)


def pytest_collection_modifyitems(config, items):
    """A run given `--harness-only-rows` / `--harness-only-models` keeps only the tests observing those rows; the
    rest are deselected (the report counts them, so the run is a subset and never replaces a complete report)."""
    wanted = from_options(config)
    if wanted is None:
        return
    kept, dropped = narrow(items, wanted)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
