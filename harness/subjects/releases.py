"""The releases on the server path: speculators >= 0.5, whose extraction is vLLM's native export over `vllm serve`.

Each release's end-to-end result on a vLLM build is the row `e2e[client<version>:<model>]` of that build's report,
held to the build's expectations like the first client's e2e rows (absent: must agree; `broken`: must still fail).
The server's own contracts are rows `client-*` (harness.clients.contracts), once per build or per model."""

from __future__ import annotations

#: The releases whose client the suites drive (speculators.data_generation.vllm_client, each loaded from its own
#: wheel), one per client contract: 0.5.0 the first (a token-id list in, the file path out, no lock protocol),
#: 0.6.0 an item dict in and the `.lock` wait (0.7.0 differs from it only in the chat request's body), 0.8.0 the
#: `handle` key and hs-connectors, 0.9.0 the current one (returns kv_transfer_params too).
CLIENTS = ("0.5.0", "0.6.0", "0.8.0", "0.9.0")
#: The current release: the one the static gate and the GPU tier's report name first.
CLIENT = CLIENTS[-1]
#: One model of each decoder family the server path treats differently: a dense GQA decoder, and Kimi-K2.5 (the
#: DeepSeek-V2 stack with MLA, whose last layer's output vLLM once exported one layer short).
CLIENT_MODELS = ("tiny-llama", "tiny-kimi-k25")
#: How a release's result starts when it failed, by side: the server (vLLM: it did not start, or the export did not
#: hold) or the release's own client code. The matrix's fault column reads them.
SERVER_FAILS, CLIENT_FAILS = "the server path fails", "the client fails"


def client_row(model: str, version: str = CLIENT) -> str:
    """The e2e row name of release `version`'s result on `model`."""
    return f"client{version}:{model}"


#: speculators release on the server path -> the hs-connectors release it declares (its wheel's Requires-Dist,
#: `hs-connectors==X`), whose used surface is recorded in fixtures/surfaces; None: it declares none and its files
#: come from vLLM's own connector. Only releases listed here can be gated.
CONNECTORS_OF = {"0.5.0": None, "0.6.0": None, "0.8.0": "0.8.0", "0.9.0": "0.9.0"}
