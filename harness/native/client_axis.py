"""The second client axis: speculators >= 0.5, whose extraction is vLLM's native export driven over `vllm serve`.

Its end-to-end result on a vLLM build is the row `e2e[client<version>:<model>]` of that build's report, held to
the build's expectations like the first client's e2e rows (absent: must agree; `broken`: must still fail)."""

from __future__ import annotations

#: The release whose client the suites drive (speculators.data_generation.vllm_client, loaded from its wheel).
CLIENT = "0.9.0"
#: One model of each decoder family the server path treats differently: a dense GQA decoder, and Kimi-K2.5 (the
#: DeepSeek-V2 stack with MLA, whose last layer's output vLLM once exported one layer short).
CLIENT_MODELS = ("tiny-llama", "tiny-kimi-k25")


def client_row(model: str, version: str = CLIENT) -> str:
    """The e2e row name of the client's result on `model`."""
    return f"client{version}:{model}"
