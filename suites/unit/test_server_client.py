"""The pieces of speculators >= 0.5's path that need no vLLM: the layer ids its launcher would accept, the
`vllm serve` command line and the port check (its client needs openai, a vLLM dependency:
suites/clients/test_server.py loads it)."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from harness.clients.server import HOST, free_port, port_taken, serve_args
from harness.clients.server_check import client_default_ids


@pytest.mark.parametrize("n, ids", [(61, [2, 30, 58, 61]), (8, [2, 4, 5, 8]), (6, [1, 3, 5, 6]), (4, [1, 2, 3, 4])])
def test_client_ids_are_the_launchers_default_or_distinct_where_it_would_refuse(n, ids):
    got = client_default_ids(n)
    assert got == ids and len(set(got)) == len(got) and got[-1] == n and min(got) >= 1


def test_serve_args_carry_the_native_export_as_speculators_launcher_does(tmp_path):
    args = serve_args("/m", [2, 3, 4], tmp_path, port=8123, dtype="float32")
    assert args[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/m"]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert spec == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 3, 4]}}}
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector" and kv["kv_role"] == "kv_producer"
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path)
    assert args[args.index("--host") + 1] == HOST and "--no-enable-chunked-prefill" in args


def test_port_check_sees_a_listening_socket():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        s.listen(1)
        assert port_taken(s.getsockname()[1])
    assert not port_taken(free_port())



def test_hs_connectors_surface_fixture_is_what_its_source_says():
    """fixtures/surfaces/hs-connectors-0.9.0.json is derived from the released wheel by AST: a fresh parse equals it,
    and it holds the vLLM internals the connectors stand on (the base class, the example connector they subclass)."""
    from harness.clients import connectors_surface as cs

    committed = json.loads(cs.fixture_path("0.9.0").read_text())
    assert committed == json.loads(json.dumps(cs.parse("0.9.0"), sort_keys=True))
    imports = set(committed["vllm_imports"])
    assert {"vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1",
            "vllm.v1.kv_cache_interface:HiddenStateCacheSpec"} <= imports
    fp8 = committed["modules"]["hs_connectors.fp8_hidden_states_connector"]["classes"]["FP8HiddenStatesConnector"]
    assert "_write_tensors" in fp8["methods"] and fp8["bases"] == ["_eh_mod.ExampleHiddenStatesConnector"]
