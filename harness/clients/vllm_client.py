"""speculators >= 0.5's own client against a `vllm serve` with the native export (harness.clients.server).

The client is speculators' `speculators/data_generation/vllm_client.py` from its released wheel, loaded by file
path: importing the package `speculators` would run its `__init__`, which needs transformers 5 and its draft
models, none of which the client uses (it needs `openai` only, which vLLM itself depends on). Loading it by
path also keeps speculators 0.3.0, installed for the in-process path, untouched in the same interpreter.

Per prompt the client sends `/v1/completions` with the token ids, `max_tokens=1` and `return_token_ids`,
checks that the echoed `prompt_token_ids` equal the prompt, and returns the file vLLM's connector wrote
(`kv_transfer_params["hidden_states_path"]`, from 0.8 also `["handle"]`); from 0.6 the client's own
`wait_for_lock` waits for the asynchronous writer's `<file>.lock`, as its training loader does (0.5 has no lock
protocol: it reads the file as soon as the response returns); a release that pins hs-connectors (0.8+) reads the
file through that hs-connectors' reader (harness.clients.declared). The file holds `hidden_states`
[tokens, layers, hidden] and `token_ids`.

The releases call `generate_hidden_states` differently (0.5: the token ids; 0.6+: an item `{"input_ids": ...}`;
0.9: returns `(handle, kv_transfer_params)`, before: the handle alone). `ClientApi` reads which from the loaded
module itself (its signature and its names), never from the version string.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from dataclasses import dataclass
from typing import Any

from harness.clients.server import ServerError
from harness.envs.wheels import CLIENT_FILE, client_tree
from harness.native.files import layers_asked, layout_of


def load_client(version: str):
    """speculators `version`'s vllm_client module (its own code), loaded by path under a private name."""
    path = client_tree(version) / CLIENT_FILE
    if not path.is_file():
        raise LookupError(f"speculators {version} has no {CLIENT_FILE}: it has no server client")
    spec = importlib.util.spec_from_file_location(f"speculators_{version.replace('.', '_')}_vllm_client", path)
    if spec is None or spec.loader is None:
        raise LookupError(f"speculators {version}'s {CLIENT_FILE} cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ClientRaces(ServerError):
    """The release's client cannot read what this server hands over safely (no lock protocol, a locked file)."""


@dataclass
class ClientApi:
    """How one release's client module is called, read from the module: the request's data parameter (`token_ids`:
    a list, else an item dict), and whether it has the lock protocol (`wait_for_lock`)."""

    module: Any  # the release's vllm_client module, as loaded
    takes_item: bool
    waits_on_locks: bool

    @classmethod
    def of(cls, module) -> ClientApi:
        params = list(inspect.signature(module.generate_hidden_states).parameters)
        if len(params) < 3 or params[2] not in ("token_ids", "client_item"):
            raise LookupError(
                f"{module.__name__}.generate_hidden_states{tuple(params)}: a request signature the "
                "harness does not know (neither token_ids nor client_item third)"
            )
        return cls(module, params[2] == "client_item", hasattr(module, "wait_for_lock"))

    def request(self, client, model: str, prompt: list[int], timeout_s: float) -> tuple[str, dict | None]:
        """One request as the release makes it: (the file it was handed, kv_transfer_params where it returns them)."""
        data = {"input_ids": prompt} if self.takes_item else prompt
        got = self.module.generate_hidden_states(client, model, data, timeout=timeout_s, max_retries=0)
        return (got[0], dict(got[1])) if isinstance(got, tuple) else (got, None)


@dataclass
class ServerExport:
    """One request through the client: one [tokens, hidden] tensor per native id asked, in the order asked.
    `kv_transfer_params` is None where the release does not return them; `lock_left` says a `<file>.lock` was
    still there after the client read the file (a release without the lock protocol leaves one per request)."""

    hidden_states: list
    token_ids: list[int]
    handle: str
    kv_transfer_params: dict | None
    waited_on_lock: bool
    layout: dict
    lock_left: bool = False
    reader: str = ""


def extract(
    server, prompts: list[list[int]], *, version: str = "0.9.0", timeout_s: float = 120.0
) -> list[ServerExport]:
    """Run `prompts` (token-id lists) through speculators `version`'s client against `server` (a VllmServer) and
    read each file back as that release does; a server that dies meanwhile is named
    (harness.clients.server.ServerDied)."""
    import openai

    from harness.clients.declared import connectors_pin, reader

    api = ClientApi.of(load_client(version))
    # Read as the release's training loader reads: through its declared hs-connectors where it pins one (which
    # waits on the lock itself), else the client module's own lock wait and a safetensors read.
    label, read = reader(version)
    by_connectors = connectors_pin(version) is not None
    client = openai.Client(base_url=server.base_url + "/v1", api_key="EMPTY", max_retries=0)
    engine_ids = sorted(set(server.native_ids))
    out = []
    for i, prompt in enumerate(prompts):
        try:
            handle, params = api.request(client, server.model, [int(t) for t in prompt], timeout_s)
        except Exception as exc:
            server.check_alive(f"the request for prompt {i}")
            raise ServerError(
                f"speculators {version}'s request for prompt {i} failed ({type(exc).__name__}: "
                f"{str(exc)[:200]}); the server's log says: {server.root_cause()}"
            ) from exc
        if not handle:  # 0.5-0.7 return kv_transfer_params.get("hidden_states_path") unchecked
            raise ServerError(
                f"speculators {version}'s request for prompt {i} returned no file: the response's "
                "kv_transfer_params has no 'hidden_states_path'"
            )
        lock = handle + ".lock"
        if not api.waits_on_locks and os.path.exists(lock):
            # The writer hands the file over behind a lock (created before the response returns); a release
            # without the lock protocol reads at once and races the writer, however this one read turns out.
            raise ClientRaces(
                f"speculators {version} has no lock protocol, but the connector handed over "
                f"{os.path.basename(handle)} behind {os.path.basename(lock)} (there when the response "
                "returned): the client reads while the writer may still be writing"
            )
        waited = api.waits_on_locks and os.path.exists(lock)
        if waited and not by_connectors:
            api.module.wait_for_lock(lock, timeout=timeout_s)
        data = read(handle, params) if by_connectors or os.path.exists(handle) else None
        if data is None:  # the writer let go (or never started) without writing: its error is logged
            server.check_alive(f"the write for prompt {i}")
            raise ServerError(
                f"the connector returned {os.path.basename(handle)} for prompt {i}"
                + (" and released its lock" if waited else "")
                + " but never wrote it; the server's log "
                f"says: {server.root_cause()}"
            )
        layout = layout_of(data)
        os.remove(handle)
        lock_left = os.path.exists(lock)
        if lock_left:
            os.remove(lock)  # the harness tidies up after a client that does not
        per_layer = layers_asked(data, handle, engine_ids, server.native_ids, tokens=len(prompt))
        out.append(
            ServerExport(
                per_layer,
                [int(t) for t in data["token_ids"].tolist()],
                handle,
                params,
                waited,
                layout,
                lock_left,
                label,
            )
        )
    return out
