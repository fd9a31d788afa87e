"""The contracts speculators 0.3.0's generator relies on, one module each, named after the contract's id.

Each module holds the contract's statement (`CONTRACT`, with its shims as `Shim` objects that say where they
attach), its probe (`probe(...)`), what its proof needs, and the upstream change that forced it. Everything
else (the proof parametrisation, where each shim is applied, the gate's coverage, the README table) is
derived from this registry.
"""

from __future__ import annotations

import functools
from importlib import import_module

from harness.contracts.base import Attach, Shim
from harness.subjects.models import fixture_names

#: Contract ids in the order speculators' run meets them. The order matters where shims compose: shims on the
#: same name apply in this order (C-chunkedprefill wraps the Scheduler that C-sched's shim builds).
IDS = (
    "import",
    "schedcfg",
    "memory",
    "blocksize",
    "kvlayout",
    "kvhelpers",
    "sched",
    "request",
    "prefixcache",
    "chunkedprefill",
    "rpc",
    "twophase",
    "mla",
    "kimistack",
    "eagle3",
    "embed",
    "layer",
    "forward",
    "moeorder",
)
#: Contracts probed once per tiny model (key "id[<fixture>]", e.g. "embed[tiny-llama]"); the others once per vLLM.
PER_MODEL = ("mla", "kimistack", "eagle3", "embed", "layer", "forward")
#: The tiny models the CPU conformance run uses: every fixture in fixtures/models/ (a new file is a new model).
E2E_MODELS = tuple(fixture_names())


@functools.cache
def global_model() -> str:
    """The tiny model the once-per-vLLM contracts (and their proofs) run on: the one fixture that says
    `"global_contracts": true` (data in fixtures/models/, never a name here)."""
    from harness.subjects.models import load_fixture

    chosen = [m for m in E2E_MODELS if load_fixture(m).get("global_contracts")]
    if len(chosen) != 1:
        raise ValueError(f'exactly one fixture in fixtures/models/ must set "global_contracts": true (have: {chosen})')
    return chosen[0]


def module_name(contract_id: str) -> str:
    """The module a contract lives in: its id, with a trailing underscore where the id is a Python keyword."""
    import keyword

    return contract_id + "_" if keyword.iskeyword(contract_id) else contract_id


@functools.cache
def modules() -> tuple:
    """The contract modules in registry order (imported once: the workers ask for their shims every batch)."""
    return tuple(import_module(f"harness.contracts.{module_name(i)}") for i in IDS)


def selected(attach: Attach, disabled=frozenset()) -> list[tuple[str, Shim]]:
    """(contract id, shim) for every shim attached at `attach`, in registry order, leaving out the contracts
    in `disabled` (a proof's run without one shim)."""
    return [
        (m.CONTRACT.id, shim)
        for m in modules()
        if m.CONTRACT.id not in disabled
        for shim in m.CONTRACT.shims_at(attach)
    ]


def refusal(generator) -> str | None:
    """Why a contract refuses every extraction by this generator (a module's `admit(generator)`), or None. Asked
    once, when the generator's workers are set up: C-eagle3's check of a stack its shim admitted."""
    for m in modules():
        admit = getattr(m, "admit", None)
        if admit is not None and (text := admit(generator)):
            return text
    return None


def start_root(failure: str, model) -> tuple[str, object] | None:
    """The per-model contract a generator's failed start is the break of, read from the failure (a module's
    `start_cause(failure, model)` confirms it against the installed vLLM), and that contract's failed attempt; or
    None where no contract claims it. The other per-model rows of that model were not observed and say so."""
    for m in modules():
        cause = getattr(m, "start_cause", None)
        if m.CONTRACT.id in PER_MODEL and cause is not None and (attempt := cause(failure, model)) is not None:
            return m.CONTRACT.id, attempt
    return None


def by_id() -> dict:
    return {m.CONTRACT.id: m for m in modules()}


def ids() -> list[str]:
    return [m.CONTRACT.id for m in modules()]


def global_ids() -> list[str]:
    return [i for i in ids() if i not in PER_MODEL]


def model_types() -> list[str]:
    """The `model_type` of every tiny model's checkpoint: the GPU tier keys its per-model rows by a checkpoint's
    model type (real checkpoints have no fixture name), and the CUDA expectation files name rows so."""
    from harness.subjects.models import load_fixture

    return sorted({load_fixture(m)["hf_config"]["model_type"] for m in E2E_MODELS})


def keys(models: list[str] | tuple[str, ...] = E2E_MODELS) -> list[str]:
    """Every contract key a run over these tiny models observes."""
    return global_ids() + [f"{i}[{m}]" for m in models for i in PER_MODEL]


#: The native-export cross-check's contract ids (suites/native; see harness.native): the first once per
#: vLLM, the others once per tiny model.
NATIVE_GLOBAL = ("native-path",)
NATIVE_PER_MODEL = ("native-config", "native-eagle3", "native-files", "native")


#: speculators >= 0.5's server path (harness.clients.contracts): once per vLLM, then per client model.
CLIENT_GLOBAL = ("client-connectors",)
CLIENT_PER_MODEL = ("client-serve", "client-http", "client-files", "client-lastlayer")


def native_keys() -> list[str]:
    """The native path's rows (suites/native): the in-process export's and the server path's, keyed by tiny model."""
    from harness.subjects.releases import CLIENT_MODELS

    return (
        list(NATIVE_GLOBAL)
        + [f"{i}[{m}]" for m in E2E_MODELS for i in NATIVE_PER_MODEL]
        + list(CLIENT_GLOBAL)
        + [f"{i}[{m}]" for m in CLIENT_MODELS for i in CLIENT_PER_MODEL]
    )


def e2e_keys() -> list[str]:
    """Optional expectation keys for the end-to-end numerics: present only where a vLLM is known to compute
    wrong numbers for a model (outcome "broken"); absent means the numeric checks must pass."""
    from harness.subjects.releases import CLIENT_MODELS, CLIENTS, client_row

    return [f"e2e[{m}]" for m in E2E_MODELS] + [f"e2e[{client_row(m, v)}]" for v in CLIENTS for m in CLIENT_MODELS]


def proof_ids() -> list[str]:
    """Contracts whose shim is proven needed and sufficient (suites/contracts/test_shim_proofs.py): every one
    that has a shim. Derived, never listed by hand."""
    return [m.CONTRACT.id for m in modules() if m.CONTRACT.shim]


def proof_keys() -> list[str]:
    """The contract rows a complete run carries a proof result for: per-model contracts once per tiny model."""
    return [
        f"{i}[{m}]" if i in PER_MODEL else i for i in proof_ids() for m in (E2E_MODELS if i in PER_MODEL else [None])
    ]


def why_no_proof(key: str) -> str:
    """For a row outside proof_keys(): why no shim proof applies to it."""
    cid = key.split("[")[0]
    module = by_id().get(cid)
    if module is None:
        return "not one of speculators' calls (vLLM's own export, or an end-to-end row): no shim to prove"
    return "the contract has no shim: there is nothing to prove"
