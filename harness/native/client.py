"""speculators >= 0.5's own client against a `vllm serve` with the native export (harness.native.server).

The client is speculators' `speculators/data_generation/vllm_client.py` from its released wheel, loaded by file
path: importing the package `speculators` would run its `__init__`, which needs transformers 5 and its draft
models, none of which the client uses (it needs `openai` only, which vLLM itself depends on). Loading it by
path also keeps speculators 0.3.0, installed for the in-process path, untouched in the same interpreter.

Per prompt the client sends `/v1/completions` with the token ids, `max_tokens=1` and `return_token_ids`,
checks that the echoed `prompt_token_ids` equal the prompt, and returns the file vLLM's connector wrote
(`kv_transfer_params["hidden_states_path"]`, or `["handle"]`); the client's own `wait_for_lock` waits for the
asynchronous writer's `<file>.lock`. The file holds `hidden_states` [tokens, layers, hidden] and `token_ids`.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from harness.native.files import layers_asked
from harness.native.server import ServerError
from harness.paths import REPO_ROOT

CLIENT_FILE = "speculators/data_generation/vllm_client.py"
#: Where unpacked client wheels live (a folder of speculators-<version>-*.whl may be given instead, for a
#: machine without network: HARNESS_SPECULATORS_WHEELS).
CACHE = REPO_ROOT / ".cache" / "speculators-clients"


def wheel_tree(project: str, version: str) -> Path:
    """`project` `version` unpacked (not installed): from HARNESS_SPECULATORS_WHEELS if it holds the wheel, else
    downloaded once from the package index (checked against its sha256)."""
    tree = CACHE / f"{project}-{version}"
    if (tree / ".complete").is_file():
        return tree
    local = os.environ.get("HARNESS_SPECULATORS_WHEELS")
    stem = project.replace("-", "_")
    wheel = next(Path(local).glob(f"{stem}-{version}-*.whl"), None) if local else None
    CACHE.mkdir(parents=True, exist_ok=True)
    downloaded = wheel is None
    if downloaded:
        from packaging.version import Version

        from harness.gate import sources

        found = next((a for a in sources.list_files(project)
                      if a.kind == "wheel" and sources.file_version(a) == Version(version)), None)
        if found is None:
            raise LookupError(f"{project} {version} has no wheel on the package index")
        wheel = sources.download(found, CACHE)  # checked against the index's sha256
    tmp = CACHE / f"{project}-{version}.tmp"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp)
    (tmp / ".complete").write_text(wheel.name + "\n")
    os.replace(tmp, tree)
    if downloaded:
        wheel.unlink()  # the unpacked tree is what is used
    return tree


def client_tree(version: str) -> Path:
    return wheel_tree("speculators", version)


def load_client(version: str):
    """speculators `version`'s vllm_client module (its own code), loaded by path under a private name."""
    path = client_tree(version) / CLIENT_FILE
    if not path.is_file():
        raise LookupError(f"speculators {version} has no {CLIENT_FILE}: it has no server client")
    spec = importlib.util.spec_from_file_location(f"speculators_{version.replace('.', '_')}_vllm_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class ServerExport:
    """One request through the client: one [tokens, hidden] tensor per native id asked, in the order asked."""

    hidden_states: list
    token_ids: list[int]
    handle: str
    kv_transfer_params: dict
    waited_on_lock: bool


def extract(server, prompts: list[list[int]], *, version: str = "0.9.0", timeout_s: float = 120.0) -> list[ServerExport]:
    """Run `prompts` (token-id lists) through speculators `version`'s client against `server` (a VllmServer) and
    read each file back; a server that dies meanwhile is named (harness.native.server.ServerDied)."""
    import openai
    from safetensors.torch import load_file

    client_module = load_client(version)
    client = openai.Client(base_url=server.base_url + "/v1", api_key="EMPTY", max_retries=0)
    engine_ids = sorted(set(server.native_ids))
    out = []
    for i, prompt in enumerate(prompts):
        try:
            handle, params = client_module.generate_hidden_states(
                client, server.model, {"input_ids": [int(t) for t in prompt]}, timeout=timeout_s, max_retries=0)
        except Exception as exc:
            server.check_alive(f"the request for prompt {i}")
            raise ServerError(f"speculators {version}'s request for prompt {i} failed ({type(exc).__name__}: "
                              f"{str(exc)[:200]}); the server's log says: {server.root_cause()}") from exc
        lock = handle + ".lock"
        waited = os.path.exists(lock)
        if waited:
            client_module.wait_for_lock(lock, timeout=timeout_s)
        if not os.path.exists(handle):  # the writer let go (or never started) without writing: its error is logged
            server.check_alive(f"the write for prompt {i}")
            raise ServerError(f"the connector returned {os.path.basename(handle)} for prompt {i}"
                              + (" and released its lock" if waited else "") + " but never wrote it; the server's log "
                              f"says: {server.root_cause()}")
        data = load_file(handle, device="cpu")
        os.remove(handle)
        per_layer = layers_asked(data, handle, engine_ids, server.native_ids, tokens=len(prompt))
        out.append(ServerExport(per_layer, [int(t) for t in data["token_ids"].tolist()], handle, dict(params), waited))
    return out
