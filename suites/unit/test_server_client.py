"""The pieces of speculators >= 0.5's path that need no vLLM: the layer ids its launcher would accept, the
`vllm serve` command line and the port check (its client needs openai, a vLLM dependency:
suites/clients/test_server.py loads it)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time

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
    assert spec == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 3, 4]}},
    }
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
    from harness.installed import connectors_surface as cs

    committed = json.loads(cs.fixture_path("0.9.0").read_text())
    assert committed == json.loads(json.dumps(cs.parse("0.9.0"), sort_keys=True))
    imports = set(committed["vllm_imports"])
    assert {
        "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1",
        "vllm.v1.kv_cache_interface:HiddenStateCacheSpec",
    } <= imports
    fp8 = committed["modules"]["hs_connectors.fp8_hidden_states_connector"]["classes"]["FP8HiddenStatesConnector"]
    assert "_write_tensors" in fp8["methods"] and fp8["bases"] == ["_eh_mod.ExampleHiddenStatesConnector"]


@pytest.mark.parametrize(
    "version, label",
    [
        ("0.6.0", "safetensors load_file"),
        ("0.8.0", "hs-connectors 0.8.0 FileTransfer.get_generated(handle)"),
        ("0.9.0", "hs-connectors 0.9.0 FileTransfer.get_generated(hs_transfer_params)"),
    ],
)
def test_a_release_reads_through_the_hs_connectors_it_pins_and_waits_on_the_writers_lock(tmp_path, version, label):
    """The reader is the pinned hs-connectors' own FileTransfer (imported from that release's wheel, not whatever is
    installed), called as its signature asks; it waits while the writer holds `<file>.lock` and reads what the writer
    wrote after letting go. 0.6.0 pins none: a plain read (the client module waits on the lock, not the reader)."""
    import fcntl
    import threading

    import torch
    from safetensors.torch import save_file

    from harness.clients import declared

    got_label, read = declared.reader(version)
    assert got_label.startswith(label)
    handle = str(tmp_path / "req-0.safetensors")
    if version == "0.6.0":
        save_file({"token_ids": torch.arange(3)}, handle)
        assert read(handle, None)["token_ids"].tolist() == [0, 1, 2]
        return
    assert sys.modules["hs_connectors.transfer"].__file__.startswith(str(declared.wheel_tree("hs-connectors", version)))
    fd = os.open(handle + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    save_file({"token_ids": torch.zeros(3, dtype=torch.int64)}, handle)

    def writer_finishes():
        time.sleep(0.5)
        save_file({"token_ids": torch.arange(3)}, handle)
        os.close(fd)  # lets go of the lock

    t = threading.Thread(target=writer_finishes)
    t.start()
    try:
        data = read(handle, {"hidden_states_path": handle})
    finally:
        t.join()
    assert data["token_ids"].tolist() == [0, 1, 2] and not os.path.exists(handle + ".lock")


def test_declared_requirements_are_the_wheels_own():
    """hs-connectors and the transformers range come from each wheel's METADATA: 0.8.0 pins hs-connectors 0.8.0,
    0.9.0 pins 0.9.0, 0.5.0 none; the client path (vllm_client.py, hs-connectors' transfer) imports no transformers."""
    from harness.clients import declared

    assert [declared.connectors_pin(v) for v in ("0.5.0", "0.8.0", "0.9.0")] == [None, "0.8.0", "0.9.0"]
    assert declared.requirements("0.8.0")["transformers"] == "<5.17.0,>=5.0.0"
    found = declared.transformers_finding("0.9.0")
    assert found["declared"] == "<=5.19.0,>=5.0.0" and found["imported_by_client_path"] is False
    if found["installed"] and found["installed"].startswith("4."):  # the unit env's transformers: below the range
        assert found["inside"] is False


def test_a_release_unpacked_by_two_processes_at_once_is_read_by_both(tmp_path, monkeypatch):
    """Test workers and background runs unpack the same client wheel side by side: the one that finishes second
    finds the first one's complete tree and uses it, leaving nothing half-unpacked (a shared temporary name made
    its rename fail with 'Directory not empty', seen in CI)."""
    import zipfile

    from harness.envs import wheels

    local = tmp_path / "wheels"
    local.mkdir()
    with zipfile.ZipFile(local / "speculators-9.9.9-py3-none-any.whl", "w") as z:
        z.writestr(wheels.CLIENT_FILE, "VALUE = 1\n")
    monkeypatch.setenv("HARNESS_SPECULATORS_WHEELS", str(local))
    monkeypatch.setattr(wheels, "CACHE", tmp_path / "cache")
    unpack = zipfile.ZipFile.extractall

    def other_process_finishes_first(self, path, *args, **kwargs):
        unpack(self, path, *args, **kwargs)
        tree = wheels.CACHE / "speculators-9.9.9"
        if not tree.exists():  # the other process's rename lands between our unpacking and ours
            unpack(self, tree)
            (tree / ".complete").write_text("speculators-9.9.9-py3-none-any.whl\n")

    monkeypatch.setattr(zipfile.ZipFile, "extractall", other_process_finishes_first)
    tree = wheels.client_tree("9.9.9")
    assert (tree / wheels.CLIENT_FILE).read_text() == "VALUE = 1\n" and (tree / ".complete").is_file()
    assert sorted(p.name for p in wheels.CACHE.iterdir()) == ["speculators-9.9.9"]  # no temporary folder left
    assert (local / "speculators-9.9.9-py3-none-any.whl").is_file()  # a given wheel is never removed
