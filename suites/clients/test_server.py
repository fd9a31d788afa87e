"""`vllm serve` as speculators >= 0.5 starts it (harness.clients.server): each way it can fail is one clear line,
and the server is stopped on every path (the leak check of every test sees to that: no process outlives it).

Real servers on the installed vLLM and a tiny Llama; nothing is mocked. On a build without the native export
the server refuses the speculative config and exits: that is the "dies before ready" case, with vLLM's own
words. Where it starts, a request that kills its engine is the "dies mid-request" case.
"""

from __future__ import annotations

import socket
import time

import pytest

from harness.clients.server import HOST, PortInUse, ServerDied, ServerNotReady, VllmServer
from harness.native import availability
from harness.subjects import models
from harness.testing.recording import not_applicable

IDS = [2, 3, 4]


@pytest.fixture(scope="module")
def llama():
    return models.build("tiny-llama")


def test_a_port_in_use_is_refused_before_anything_starts(llama):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        s.listen(1)
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(PortInUse, match=rf"^port {port} on {HOST} is already in use: vllm serve was not started$"):
            VllmServer(llama.path, IDS, port=port)
        assert time.monotonic() - t0 < 1, "the port is checked before vLLM is started"


def test_a_server_that_is_not_ready_in_time_is_stopped_and_says_so(llama):
    t0 = time.monotonic()
    with pytest.raises(ServerNotReady, match=r"did not answer /health within 2 s \(stopped\); its last words: "):
        VllmServer(llama.path, IDS, dtype="float32", ready_timeout_s=2, grace_s=5)
    assert time.monotonic() - t0 < 40


def test_a_server_that_dies_before_it_is_ready_names_vllm_s_error(llama, tmp_path):
    """Where the native path cannot run here (no export in this vLLM, or this build's runner refuses it), the
    server refuses the export's config and exits: that is the case, named by vLLM. Where it has one, a checkpoint folder whose architecture vLLM does not know is."""
    if not availability()[0]:
        with pytest.raises(
            ServerDied,
            match=r"^vllm serve exited with exit code \d+ before it was ready: "
            r".*(SpeculativeConfig|extract_hidden_states|validation error for VllmConfig)",
        ):
            VllmServer(llama.path, IDS, dtype="float32", ready_timeout_s=600)
        return
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    (bad / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"], "model_type": "no_such"}')
    with pytest.raises(ServerDied, match=r"^vllm serve exited with exit code \d+ before it was ready: \S"):
        VllmServer(bad, IDS, dtype="float32", ready_timeout_s=300)


def test_with_the_native_export_the_server_serves_or_fails_in_one_line(llama):
    """The server either fails to start on this platform (one line, vLLM's cause) or serves: then speculators
    0.9.0's client either gets the file, or its request fails with what the server's log says (a CPU build's
    connector needs CUDA to write)."""
    from harness.clients.server import ServerError
    from harness.clients.vllm_client import extract

    ok, why = availability()
    if not ok:
        not_applicable(f"{why}; its refusal is the previous test")
    try:
        server = VllmServer(llama.path, IDS, dtype="float32", ready_timeout_s=600)
    except ServerDied as e:
        assert "\n" not in str(e) and str(e).split("before it was ready: ")[1].strip(), str(e)
        return
    with server:
        prompt = [[(7 * j) % 200 + 4 for j in range(24)]]
        try:
            got = extract(server, prompt)
        except ServerError as e:
            assert "the server's log says: " in str(e) and not str(e).endswith("no output"), str(e)
            return
        assert got[0].token_ids == prompt[0] and [tuple(h.shape)[0] for h in got[0].hidden_states] == [24] * len(IDS)


def test_speculators_090_client_loads_from_its_wheel_without_importing_the_package():
    """Its package __init__ needs transformers 5; the client module needs openai only (a vLLM dependency)."""
    import sys

    from harness.clients.vllm_client import load_client

    module = load_client("0.9.0")
    assert callable(module.generate_hidden_states) and callable(module.wait_for_lock)
    assert module.__name__ == "speculators_0_9_0_vllm_client"
    assert "speculators.data_generation.vllm_client" not in sys.modules
