"""Every watched path and every contract of the gate is owned by report rows a run observes (harness.gate.observe.
owners): a change the static reading cannot classify is always settled by running the candidate."""

from __future__ import annotations

from harness import contracts
from harness.gate.observe import owners
from harness.testing.rows import Wanted
from harness.vllm_source.facts import RUNTIME, SURFACE


def test_every_watched_path_and_contract_names_rows_a_run_observes():
    from harness.gate.read.reach.scope import WATCH

    assert owners.unowned([*WATCH, *contracts.ids(), RUNTIME, SURFACE]) == []
    observable = set(contracts.keys()) | {f"e2e[{m}]" for m in contracts.E2E_MODELS}
    for cid in [*WATCH, *contracts.ids(), RUNTIME, SURFACE]:
        rows = owners.rows_of(cid)
        assert rows and set(rows) <= observable, (cid, rows)
        assert owners.e2e_row() in rows, "the extraction itself settles every path"


def test_the_runtime_path_is_settled_by_the_extraction_on_the_tiny_model():
    assert owners.rows_of(RUNTIME) == ("e2e[tiny-llama]",)
    assert owners.rows_of("embed") == ("embed[tiny-llama]", "e2e[tiny-llama]")
    assert owners.rows_of("twophase") == ("twophase", "e2e[tiny-llama]")


def test_what_a_reading_found_becomes_the_rows_to_observe():
    """A reading with a finding in `request`, an open change on the runtime path and a contract the sources cannot
    show (`import`): their rows and the extraction, nothing else."""
    from types import SimpleNamespace

    reading = SimpleNamespace(
        findings=[SimpleNamespace(contract="request")],
        not_checked={},
        unclassified=[SimpleNamespace(contract=RUNTIME)],
        contracts={"request": {"status": "covered"}, "rpc": {"status": "unchanged"}},
        outside={"import": {}},
    )
    assert owners.wanted(reading) == Wanted(frozenset({"request", "import", "e2e[tiny-llama]"}))
