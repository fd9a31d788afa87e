"""The native path's contract rows: each a Contract without a shim (we report, not repair), built from
NativeProbes (one observed call each) by `observe`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from harness.contracts.base import Attempt, Contract, Observation, summarize
from harness.native.files import NativeExport


def native_contract(id: str, assumes: str, native_says: str = "holds on this vLLM") -> Contract:
    """A contract of vLLM's own export (the in-process one here, the served one in harness.clients.contracts): no
    shim (we report, not repair), any failure documented as itself."""
    return Contract(id=id, assumes=assumes, failures=(r".",), native_says=native_says, broken_says="does not hold here")


#: The cross-check as a contract row `native[<model>]`, expected per vLLM version like the others.
#: native: vLLM's own export runs here and equals ours at the mapped ids; broken: this vLLM has the
#: export but it does not run on this platform for the model, or it disagrees (reason says which);
#: n/a: this vLLM has no native export, or no such model class. There is no shim: we report, not repair.
CONTRACT = native_contract(
    "native",
    "vLLM's own extract_hidden_states export gives the hidden states ours gives, at ids mapped k -> k + 1",
    native_says="vLLM's native export runs here and agrees with ours",
)

#: The native path's own contracts, each a row like the others (expected per vLLM version, no shim: where one
#: does not hold, the native path cannot be used here and the reason says why). `native-path` once per vLLM;
#: the others once per tiny model (`native-config[tiny-llama]`, ...). Built from NativeProbes by `observe`.
PATH_CONTRACT = native_contract(
    "native-path",
    "vLLM has the speculative method 'extract_hidden_states' and the KV connector 'ExampleHiddenStatesConnector'",
)
CONFIG_CONTRACT = native_contract(
    "native-config",
    "EngineArgs accept speculative_config {method: extract_hidden_states, eagle_aux_hidden_state_layer_ids} and "
    "kv_transfer_config {kv_connector: ExampleHiddenStatesConnector} for the model, and carry them into the engine config",
)
EAGLE3_CONTRACT = native_contract(
    "native-eagle3",
    "the model class vLLM loads for the checkpoint implements SupportsEagle3 (the native path collects "
    "auxiliary hidden states through it)",
)
FILES_CONTRACT = native_contract(
    "native-files",
    "each request returns kv_transfer_params['hidden_states_path']; the safetensors file holds hidden_states "
    "[tokens, layers, hidden] float32 and token_ids == the prompt, complete once its lock (if any) is released",
)
#: Per-model native contracts, in the order a user meets them.
PER_MODEL_CONTRACTS = (CONFIG_CONTRACT, EAGLE3_CONTRACT, FILES_CONTRACT, CONTRACT)


@dataclass
class NativeProbe:
    """One contract of the native path, observed: what was called, what came back, whether it holds.

    `attempt` is the call (ok, or the exception it raised, as harness.contracts.base records it);
    `holds` is the verdict on what came back when the call returned (None: nothing to judge);
    `not_applicable` says why the contract cannot be observed here (e.g. no native path at all).
    """

    check: str
    called: str
    attempt: Attempt
    returned: Any = None
    holds: bool | None = None
    not_applicable: str | None = None

    @property
    def result(self) -> str:
        if self.not_applicable:
            return "n/a"
        return "pass" if self.attempt.ok and self.holds is not False else "fail"

    @property
    def measured(self) -> str:
        if self.not_applicable:
            return self.not_applicable
        said = f"{self.called} -> "
        said += f"{self.returned}" if self.attempt.ok else self.attempt.text
        return summarize(said, 900)

    def to_json(self) -> dict:
        return {
            "check": self.check,
            "called": self.called,
            "result": self.result,
            "returned": _jsonable(self.returned),
            "ok": self.attempt.ok,
            "error_type": self.attempt.error_type,
            "error": self.attempt.error,
            "raised_at": self.attempt.detail.get("raised_at"),
            "not_applicable": self.not_applicable,
        }


def _jsonable(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)


def checked(check: str, called: str, fn, verdict=None) -> NativeProbe:
    """Run `fn`; `verdict(value) -> (holds, returned)` judges what came back."""
    attempt, value = Attempt.run(fn)
    if not attempt.ok:
        return NativeProbe(check, called, attempt)
    holds, returned = verdict(value) if verdict else (None, value)
    return NativeProbe(check, called, attempt, returned, holds)


def probe_run(start: Attempt, called: str) -> NativeProbe:
    """The native path starts and extracts on this platform (the start+first extraction attempt)."""
    return NativeProbe(
        "native path runs on this platform (engine start + extraction)", called, start, "ok" if start.ok else None
    )


def probe_path_returned(export: NativeExport) -> NativeProbe:
    p = export.kv_transfer_params.get("hidden_states_path")
    return NativeProbe(
        "kv_transfer_params['hidden_states_path'] returned per request",
        "RequestOutput.kv_transfer_params",
        Attempt(True),
        {"hidden_states_path": p},
        bool(p),
    )


def probe_layout(export: NativeExport, prompt: list[int], num_layers_requested: int, hidden_size: int) -> NativeProbe:
    """The file holds exactly `hidden_states` [tokens, layers, hidden] float32 and `token_ids` == the prompt."""
    lay = export.layout
    want = {
        "hidden_states": ((len(prompt), num_layers_requested, hidden_size), "float32"),
        "token_ids": ((len(prompt),), None),
    }
    ok = set(lay) == set(want) and all(
        lay[k][0] == shape and (dt is None or lay[k][1] == dt) for k, (shape, dt) in want.items()
    )
    ok = ok and export.token_ids == [int(t) for t in prompt]
    returned: dict[str, str | bool] = {k: f"{list(s)} {d}" for k, (s, d) in lay.items()}
    returned["token_ids == prompt"] = export.token_ids == [int(t) for t in prompt]
    return NativeProbe(
        "file layout: hidden_states [tokens, layers, hidden] float32, token_ids == prompt",
        "safetensors.torch.load_file(hidden_states_path)",
        Attempt(True),
        returned,
        ok,
    )


def probe_write_protocol(export: NativeExport, writes_locks: bool) -> NativeProbe:
    """The reader honoured the connector's write protocol: a connector whose writer creates `<file>.lock`
    must have handed us a file with its lock (read under a shared flock, then removed); one without must
    have handed over a complete file. Fails when the file and the connector's protocol disagree, or a lock
    file is left behind after reading."""
    how = (
        "async: <file>.lock held by the writer, read under a shared flock, then removed"
        if export.waited_on_lock
        else "synchronous: file complete when the request returns, no lock file"
    )
    if writes_locks != export.waited_on_lock:
        return NativeProbe(
            "write protocol (lock file) handled",
            "read_export(hidden_states_path)",
            Attempt.failed(
                "ContractViolated",
                f"the connector {'creates' if writes_locks else 'creates no'} lock files, but the "
                f"export came {'without' if writes_locks else 'with'} one ({how})",
            ),
            how,
            False,
        )
    if os.path.exists(export.path + ".lock"):
        return NativeProbe(
            "write protocol (lock file) handled",
            "read_export(hidden_states_path)",
            Attempt.failed("ContractViolated", f"{os.path.basename(export.path)}.lock is still there after reading"),
            how,
            False,
        )
    return NativeProbe(
        "write protocol (lock file) handled", "read_export(hidden_states_path)", Attempt(True), how, True
    )


# -- probes -> contract rows ---------------------------------------------------------------------------
def observe(
    contract: Contract, probes: list[NativeProbe], subject: str | None = None, not_applicable: str | None = None
) -> Observation:
    """The row for `contract` from the probes that make it up: native if every probe holds, broken with the
    first failing probe's words if one does not, n/a (with the reason) where none can be observed here.
    Each probe's call and result stay in the row's facts."""
    obs = Observation(contract, Attempt(True), subject=subject)
    obs.facts["checks"] = [p.to_json() for p in probes]
    observable = [p for p in probes if not p.not_applicable]
    if not_applicable or not observable:
        obs.not_applicable = not_applicable or (probes[0].not_applicable if probes else "nothing observed")
        return obs
    failed = [p for p in observable if p.result == "fail"]
    if failed:
        first = failed[0]
        err = first.attempt if not first.attempt.ok else Attempt.failed("ContractViolated", first.measured)
        obs.unshimmed = Attempt.failed(
            err.error_type or "ContractViolated", f"{first.check}: {err.error}", **err.detail
        )
    return obs


def observe_path(method: NativeProbe, connector: NativeProbe) -> Observation:
    """`native-path`: n/a where this vLLM has neither (no native export yet), broken where only one half is there."""
    results = {method.result, connector.result}
    if results == {"fail"}:
        return observe(
            PATH_CONTRACT,
            [method, connector],
            not_applicable=(f"no native hidden-state export in this vLLM: {method.measured}; {connector.measured}"),
        )
    return observe(PATH_CONTRACT, [method, connector])
