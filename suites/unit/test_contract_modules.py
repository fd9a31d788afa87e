"""Each contract is one module, named after its id, holding every part the rest of the harness derives from.

Adding a contract means writing its module and its expectation rows, nothing else: these tests fail when a
module lacks a declared part, when a shim is not an object of its own module, or when a table elsewhere has
to be kept by hand.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from harness import contracts
from harness.contracts.base import Attach, Contract

CONTRACTS_DIR = Path(contracts.__file__).parent
NOT_CONTRACTS = {"__init__", "base"}


def test_every_module_in_the_package_is_a_registered_contract_named_after_its_id():
    files = {p.stem for p in CONTRACTS_DIR.glob("*.py")} - NOT_CONTRACTS
    assert files == {contracts.module_name(i) for i in contracts.IDS}
    assert [m.CONTRACT.id for m in contracts.modules()] == list(contracts.IDS)
    assert contracts.module_name("import") == "import_"


@pytest.mark.parametrize("module", contracts.modules(), ids=lambda m: m.CONTRACT.id)
def test_a_contract_module_declares_every_part(module):
    c = module.CONTRACT
    assert isinstance(c, Contract) and module.__name__.endswith("." + contracts.module_name(c.id))
    assert (module.__doc__ or "").strip(), "a docstring: what speculators assumes and why the shim is honest"
    assert c.assumes and c.upstream, "the statement and the upstream change that forced the contract"
    assert callable(getattr(module, "probe", None)), "a probe that drives the installed vLLM"
    if c.shims:
        assert c.failures, "a shimmed outcome needs the failure the contract documents"
    for shim in c.shims:
        assert isinstance(shim.attach, Attach) and callable(shim.fn)
        assert shim.fn.__module__ == module.__name__, f"{shim.name}: a shim lives in its contract's module"
        params = list(inspect.signature(shim.fn).parameters)
        assert len(params) == ATTACH_ARITY[shim.attach], f"{shim.name} does not take what {shim.attach} passes"
    for check in c.gate_checks:
        assert check.__module__ == module.__name__, f"{check.__qualname__}: a gate check lives in its contract's module"
        assert list(inspect.signature(check).parameters) == ["tree", "used", "follower"]
    for cover in c.gate_covers:
        allowed = [s.fn for s in c.shims] or [getattr(module, "worker_probe", None)]
        assert cover.fn in allowed, f"gate cover {cover.kind} names {cover.shim}, not one of the contract's shims"


#: How many arguments each attach site passes (harness.contracts.base.Attach documents them).
ATTACH_ARITY = {
    Attach.IMPORT: 0,
    Attach.ENV: 0,
    Attach.GENERATOR: 3,
    Attach.EXECUTOR: 2,
    Attach.RPC_REPLY: 3,
    Attach.STEP: 2,
    Attach.BATCH_START: 2,
    Attach.WORKER: 1,
    Attach.WORKER_GLOBALS: 3,
    Attach.WORKER_AFTER: 1,
    Attach.WORKER_STATES: 2,
    Attach.WORKER_ROWS: 3,
    Attach.WORKER_RESET: 1,
}


def test_every_attach_point_has_its_arity_and_an_applying_site():
    """A new attach point needs a site that applies it: the generator, the executor view or the worker extension."""
    assert set(ATTACH_ARITY) == set(Attach)
    root = CONTRACTS_DIR.parent
    sites = "".join((root / "runtime" / f).read_text() for f in ("generator.py", "executor_view.py", "worker.py"))
    sites += (root / "contracts" / "mla.py").read_text()  # ENV: decided per model before the executor starts
    for attach in Attach:
        assert f"Attach.{attach.name}" in sites, f"nothing applies shims attached at {attach}"


def test_no_site_wires_a_contract_by_name():
    """The generator, the executor view and the worker apply shims through the registry only."""
    root = CONTRACTS_DIR.parent
    for f in ("executor_view.py", "worker.py"):
        text = (root / "runtime" / f).read_text()
        named = [
            i
            for i in contracts.IDS
            if f"contracts import {contracts.module_name(i)}" in text
            or f"{contracts.module_name(i)}.CONTRACT" in text
            or re.search(rf'"{i}"\s*(not in|in|==)|==\s*"{i}"', text)
        ]
        assert not named, f"{f} names contracts {named}"


def test_the_gate_tables_are_derived_from_the_contract_modules():
    from harness.gate.read import contract_checks, coverage

    assert (
        "def " not in contract_checks.__doc__ and len([m for m in contracts.modules() if m.CONTRACT.gate_checks]) >= 10
    )

    assert {c.contract for c in coverage.COVERS} <= set(contracts.IDS)
    assert {cid for cid, _ in coverage.OUTSIDE.items()} == {
        m.CONTRACT.id for m in contracts.modules() if m.CONTRACT.gate_outside
    }
    assert coverage.validate(contracts.ids()) == []
    twophase = next(c for c in coverage.COVERS if c.contract == "twophase")
    assert twophase.shim == "harness.contracts.twophase.sample_after_step"
