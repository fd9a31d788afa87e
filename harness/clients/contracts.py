"""The contracts of speculators >= 0.5's path on a vLLM build: what its launcher and client need of `vllm serve`,
and what hs-connectors needs of vLLM's internals. Rows like the native export's (no shim: we report, not repair;
held to the expectations per build), observed by suites/clients/test_client.py from one server per tiny model:

* `client-serve[model]`: `vllm serve` with the launcher's flags (speculative method `extract_hidden_states`, the
  aux layer ids, `ExampleHiddenStatesConnector` as kv_producer with a storage path) starts and answers /health.
  Whether the export's config is accepted with chunked prefill on (vLLM's default) is recorded per build as a fact
  (the connector refuses it on some builds and not on others); the harness, like the launcher, turns it off.
* `client-http[model]`: `/v1/completions` with a token-id prompt, `max_tokens=1`, `return_token_ids` echoes
  `prompt_token_ids` and returns `kv_transfer_params["hidden_states_path"]` (speculators 0.8+ also take
  `["handle"]`), read raw by the harness, whatever a client makes of it.
* `client-files[model]`: that file is one safetensors file with `hidden_states` [tokens, layers, hidden] and
  `token_ids` == the prompt, complete once the writer's `<file>.lock` (where it makes one) is released.
* `client-lastlayer[model]`: native id n, the last layer's output (the launcher's `--include-last-layer`), is
  exported and equals the final decoder layer's output. vLLM's DeepSeek-V2 backbone (DeepSeek-V3, Kimi-K2.5)
  captured aux states only at decoder-layer inputs, so id n matched nothing and one state fewer came back, until
  vllm-project/vllm#46973 (the Llama family captures layer outputs since the EagleModelMixin consolidation,
  vllm-project/vllm#36063): the engine then dies one layer short, or a consumer reads the wrong layer.
* `client-connectors` (once per build): every vLLM name hs-connectors (speculators 0.8+'s connectors; the used
  surface in fixtures/surfaces/, derived from its wheel by AST) imports resolves on the installed vLLM, and each of
  its subclasses fits its vLLM base (private overrides such as the FP8 connector's `_write_tensors` keep their
  parameters, abstract methods implemented), read from the installed vLLM's source as the static gate
  (`gate --client`) reads a candidate's.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from harness.contracts.base import Attempt
from harness.native.rows import NativeProbe, native_contract, observe

SERVE = native_contract(
    "client-serve",
    "vllm serve MODEL --speculative-config {method: extract_hidden_states, ...} --kv-transfer-config "
    "{kv_connector: ExampleHiddenStatesConnector, kv_role: kv_producer, ...} starts and answers /health",
)
HTTP = native_contract(
    "client-http",
    "/v1/completions (token-id prompt, max_tokens=1, return_token_ids) echoes prompt_token_ids and "
    "returns kv_transfer_params['hidden_states_path'] (or ['handle'])",
)
FILES = native_contract(
    "client-files",
    "the returned file is safetensors with hidden_states [tokens, layers, hidden] and token_ids == "
    "the prompt, complete once its .lock (if any) is released",
)
LASTLAYER = native_contract(
    "client-lastlayer",
    "native id n (the last layer's output, --include-last-layer) is exported and equals the final "
    "decoder layer's output",
)
CONNECTORS = native_contract(
    "client-connectors",
    "every vLLM name hs-connectors imports resolves here, and its connector subclasses fit "
    "their vLLM bases (private overrides' parameters, abstract methods)",
)
PER_MODEL = (SERVE, HTTP, FILES, LASTLAYER)
GLOBAL = (CONNECTORS,)


def _after_serve(rep: dict) -> str | None:
    serve = rep.get("serve") or {}
    return None if serve.get("started") else f"not observable: the server did not start (client-serve[{rep['model']}])"


def observe_model(rep: dict, chunked: NativeProbe | None = None) -> list:
    """The four per-model rows from one server_check report (harness.clients.server_check.run)."""
    model, serve = rep["model"], rep.get("serve") or {}
    started = NativeProbe(
        "vllm serve starts with the export's flags and answers /health",
        "vllm serve " + " ".join(serve.get("args", [])),
        Attempt(True)
        if serve.get("started")
        else Attempt.failed("ServerError", serve.get("error", "no server was started")),
        f"ready in {serve.get('start_s')} s, {serve.get('writer')}" if serve.get("started") else None,
        bool(serve.get("started")),
    )
    obs = [observe(SERVE, [started], subject=model)]
    if chunked is not None:
        obs[0].facts["chunked_prefill"] = chunked.to_json()
    na = _after_serve(rep)
    http = rep.get("http") or {}
    if na or not http:
        why = na or "not observable: the server died before the first request"
        return obs + [observe(c, [], subject=model, not_applicable=why) for c in (HTTP, FILES, LASTLAYER)]
    called = "POST /v1/completions {prompt: token ids, max_tokens: 1, return_token_ids: true}"
    if not http.get("ok"):
        probe = NativeProbe("the request is answered", called, Attempt.failed("HTTPError", http.get("error", "")))
        return (
            obs
            + [observe(HTTP, [probe], subject=model)]
            + [
                observe(c, [], subject=model, not_applicable=f"not observable: client-http[{model}] fails")
                for c in (FILES, LASTLAYER)
            ]
        )
    echoed = NativeProbe(
        "prompt_token_ids echoed",
        called,
        Attempt(True),
        http["prompt_token_ids_echoed"],
        http["prompt_token_ids_echoed"],
    )
    keyed = NativeProbe(
        "kv_transfer_params names the file",
        called,
        Attempt(True),
        {"keys": http["kv_transfer_params_keys"], "file_key": http["file_key"]},
        bool(http["file_key"]),
    )
    obs.append(observe(HTTP, [echoed, keyed], subject=model))
    files = http.get("file") or {}
    if not files:
        obs.append(
            observe(FILES, [], subject=model, not_applicable=f"not observable: no file named (client-http[{model}])")
        )
    else:
        layout = NativeProbe(
            "safetensors layout",
            "read_export(file) (lock honoured)",
            Attempt(True) if files.get("ok") else Attempt.failed("ReadError", files.get("error", "")),
            files.get("layout"),
            files.get("holds"),
        )
        obs.append(observe(FILES, [layout], subject=model))
        obs[-1].facts["lock"] = files.get("lock")
    obs.append(_last_layer(rep))
    return obs


def _last_layer(rep: dict):
    model, n = rep["model"], max(rep["native_ids"])  # the ids asked; n, the last layer's output, is the largest
    called = f"vllm serve with eagle_aux_hidden_state_layer_ids ending in {n} (the model's layer count)"
    if "failure" in rep:
        probe = NativeProbe(f"native id {n} exported", called, Attempt.failed("ServerError", rep["failure"]))
    elif "last_layer_is_final_output" not in rep:
        return observe(LASTLAYER, [], subject=model, not_applicable="not observable: no client read a file back")
    else:
        same = rep["last_layer_is_final_output"]
        diffs = {v: c["per_native_id"].get(str(n)) for v, c in rep["clients"].items() if c.get("per_native_id")}
        probe = NativeProbe(
            f"native id {n} equals our id {n - 1} (the final layer's output)", called, Attempt(True), diffs, same
        )
    return observe(LASTLAYER, [probe], subject=model)


def observe_connectors(surface_path: Path, vllm_root: Path) -> object:
    """`client-connectors`: each name imported (importlib, on the installed vLLM) and each subclass need read from
    the installed vLLM's source by the static gate's own check."""
    import json

    from harness.vllm_source import server_path

    surface = json.loads(surface_path.read_text())
    probes = []
    for ref in surface["vllm_imports"]:
        module, name = ref.split(":")
        probes.append(_import_probe(module, name))
    tree = server_path.Tree(vllm_root)
    for nid, what, fn in server_path.connector_needs(surface):
        if nid.startswith("subclass "):
            holds, evidence = fn(tree)
            probes.append(
                NativeProbe(
                    what, nid, Attempt(True) if holds else Attempt.failed("ContractViolated", evidence), evidence, holds
                )
            )
    return observe(CONNECTORS, probes)


def _import_probe(module: str, name: str) -> NativeProbe:
    def get():
        mod = importlib.import_module(module)
        if hasattr(mod, name):
            return getattr(mod, name)
        if hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None:
            return importlib.import_module(f"{module}.{name}")  # `from pkg import submodule`
        raise ImportError(f"cannot import name {name!r} from {module!r}")

    attempt, value = Attempt.run(get)
    return NativeProbe(
        f"from {module} import {name}",
        f"import {module}",
        attempt,
        getattr(value, "__qualname__", getattr(value, "__name__", None)) if attempt.ok else None,
        True if attempt.ok else None,
    )
