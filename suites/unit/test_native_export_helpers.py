"""harness.native's helpers that need no vLLM: the layer-id mapping at both ends, the reader of
the connector's files (and its lock-file protocol), and the reader of vLLM's engine log.

The same functions meet the real vLLM in suites/native (where the unmapped ids must disagree).
"""

from __future__ import annotations

import time

import pytest

from harness import native as nx
from harness.contracts.base import Attempt


# -- the mapping, at both ends (no vLLM needed) --------------------------------------------------------
@pytest.mark.parametrize("n", [4, 6, 61])
def test_layer_map_first_layer(n):
    """speculators' 0 (output of layer 0) is native 1 (input of layer 1), and back."""
    assert nx.map_layer_ids([0], n) == [1]
    assert nx.map_layer_ids([1], n, to="speculators") == [0]


@pytest.mark.parametrize("n", [4, 6, 61])
def test_layer_map_last_layer(n):
    """speculators' n-1 (last layer's output) is native n (vLLM's id for the final pre-norm output), and back."""
    assert nx.map_layer_ids([n - 1], n) == [n]
    assert nx.map_layer_ids([n], n, to="speculators") == [n - 1]


def test_layer_map_round_trip_keeps_order():
    ids = [5, 1, 3, 0]
    assert nx.map_layer_ids(ids, 6) == [6, 2, 4, 1]
    assert nx.map_layer_ids(nx.map_layer_ids(ids, 6), 6, to="speculators") == ids


@pytest.mark.parametrize("ids,to", [([6], "native"), ([-1], "native"), ([0], "speculators"), ([7], "speculators")])
def test_layer_map_refuses_out_of_range(ids, to):
    """Native 0 (the embeddings) has no speculators id; nothing wraps around silently."""
    with pytest.raises(ValueError):
        nx.map_layer_ids(ids, 6, to=to)


# -- reading the files, and reading vLLM's log (no engine needed) ------------------------------------------
def test_read_export_waits_for_the_writers_lock(tmp_path):
    """The async writer's protocol (vLLM >= 0.22): the reader sleeps on the lock until the writer lets go.

    A thread stands in for vLLM's writer thread exactly as it behaves: it holds LOCK_EX on `<file>.lock`
    (its own open file, so the lock conflicts with ours) while it writes, then closes the descriptor.
    """
    import fcntl
    import os
    import threading

    import torch
    from safetensors.torch import save_file

    path = str(tmp_path / "req-0.safetensors")
    fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    tensors = {
        "hidden_states": torch.arange(24, dtype=torch.float32).reshape(4, 2, 3),
        "token_ids": torch.tensor([5, 6, 7, 8]),
    }
    released = []

    def writer():
        time.sleep(0.5)
        save_file(tensors, path)
        released.append(time.perf_counter())
        os.close(fd)  # releases LOCK_EX

    t = threading.Thread(target=writer)
    t.start()
    data, waited = nx.read_export(path)
    done = time.perf_counter()
    t.join()
    assert waited and released and done >= released[0]
    assert torch.equal(data["hidden_states"], tensors["hidden_states"]) and data["token_ids"].tolist() == [5, 6, 7, 8]
    assert not os.path.exists(path + ".lock") and not os.path.exists(path)


def test_read_export_without_lock_and_missing_file(tmp_path):
    """The synchronous writer (0.17-0.20) leaves no lock; a path with neither file nor lock is a clear error."""
    import torch
    from safetensors.torch import save_file

    path = str(tmp_path / "req-1.safetensors")
    save_file({"hidden_states": torch.zeros(2, 1, 3), "token_ids": torch.tensor([1, 2])}, path)
    data, waited = nx.read_export(path, remove=False)
    assert not waited and tuple(data["hidden_states"].shape) == (2, 1, 3)
    with pytest.raises(FileNotFoundError):
        nx.read_export(str(tmp_path / "absent.safetensors"))


def test_read_export_when_the_writer_dies(tmp_path):
    """Seen on vLLM 0.32 (CPU): the writer's lock is released (its process died) but no file was written."""
    import fcntl
    import os

    path = str(tmp_path / "req-2.safetensors")
    fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.close(fd)  # let go without writing
    with pytest.raises(FileNotFoundError, match="never written"):
        nx.read_export(path)


#: Lines as vLLM 0.20 printed them on this machine when its CPU runner could not start the native path.
VLLM_LOG = """\
(Worker pid=30433) ERROR 12-01 10:06:15 [multiproc_executor.py:962] WorkerProc hit an exception.
(Worker pid=30433) ERROR 12-01 10:06:15 [multiproc_executor.py:962] Traceback (most recent call last):
(Worker pid=30433) ERROR 12-01 10:06:15 [multiproc_executor.py:962]   File "/x/site-packages/vllm/v1/worker/gpu_model_runner.py", line 5546, in _dummy_run
(Worker pid=30433) ERROR 12-01 10:06:15 [multiproc_executor.py:962]     hidden_states, _ = outputs
(Worker pid=30433) ERROR 12-01 10:06:15 [multiproc_executor.py:962] ValueError: too many values to unpack (expected 2)
(EngineCore pid=30420) ERROR 12-01 10:06:15 [core.py:1136] RuntimeError: Worker failed with error 'too many values to unpack (expected 2)', please check the stack trace above for the root cause
"""


def test_root_cause_is_the_first_real_exception():
    """What reaches the caller is a wrapper; the report needs the worker's own exception and where it was raised."""
    cause = nx.root_cause(VLLM_LOG)
    assert (
        cause
        == "ValueError: too many values to unpack (expected 2) @ vllm/v1/worker/gpu_model_runner.py:5546 in _dummy_run"
    )
    assert nx.root_cause("INFO all good\n") is None


#: vllm serve 0.11.0 refusing the export's speculative method, its prefixes coloured as it prints them.
COLOURED_LOG = (
    "\x1b[1;36m(APIServer pid=22427)\x1b[0;0m pydantic_core._pydantic_core.ValidationError: 1 validation error for "
    "SpeculativeConfig\n"
    "\x1b[1;36m(APIServer pid=22427)\x1b[0;0m method\n"
    "\x1b[1;36m(APIServer pid=22427)\x1b[0;0m     For further information visit https://errors.pydantic.dev/2.14/v/literal_error\n"
)


def test_root_cause_reads_through_terminal_colours():
    """Found on 0.11.0: the server's coloured prefix hid the exception line, and the cause became the log's last line."""
    assert nx.root_cause(COLOURED_LOG) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig"
    )


def test_platform_failures_are_not_retried_with_other_layers():
    """A CUDA-only stream on a CPU build is the platform's failure; an IndexError in a model's loop is not."""
    cuda = nx.NativeExportError(
        "extract",
        RuntimeError("EngineCore encountered an issue"),
        "torch.AcceleratorError: CUDA error: CUDA driver version is insufficient",
        "",
    )
    index = nx.NativeExportError(
        "extract",
        RuntimeError("EngineCore encountered an issue"),
        "IndexError: list index out of range @ vllm/model_executor/models/llama.py:400",
        "",
    )
    assert nx.platform_failure(cuda) and not nx.platform_failure(index)


# -- probes -> contract rows ----------------------------------------------------------------------------------
def _probe(check, ok=True, holds=True, na=None):
    attempt = Attempt(True) if ok else Attempt.failed("ValidationError", "refused", raised_at="vllm/config.py:1")
    return nx.NativeProbe(check, f"call({check})", attempt, "value" if ok else None, holds if ok else None, na)


def test_observe_native_when_every_probe_holds():
    obs = nx.observe(nx.FILES_CONTRACT, [_probe("path"), _probe("layout")], subject="tiny-llama")
    assert obs.key == "native-files[tiny-llama]" and obs.outcome.value == "native"
    assert [c["check"] for c in obs.facts["checks"]] == ["path", "layout"]


def test_observe_broken_names_the_first_failing_probe():
    obs = nx.observe(
        nx.FILES_CONTRACT, [_probe("path"), _probe("layout", holds=False), _probe("x", ok=False)], subject="m"
    )
    assert obs.outcome.value == "broken" and "layout" in obs.reason and "ContractViolated" in obs.reason
    raised = nx.observe(nx.CONFIG_CONTRACT, [_probe("config", ok=False)], subject="m")
    assert raised.outcome.value == "broken"
    assert "ValidationError" in raised.reason and "vllm/config.py:1" in raised.reason


def test_observe_na_when_nothing_is_observable():
    assert nx.observe(nx.EAGLE3_CONTRACT, [], subject="m", not_applicable="no such model").outcome.value == "n/a"
    obs = nx.observe(nx.EAGLE3_CONTRACT, [_probe("a", na="not here")], subject="m")
    assert obs.outcome.value == "n/a" and obs.reason == "not here"


def test_observe_path_needs_both_halves():
    absent = _probe("method", holds=False), _probe("connector", holds=False)
    assert nx.observe_path(*absent).outcome.value == "n/a"
    assert nx.observe_path(_probe("method"), _probe("connector", holds=False)).outcome.value == "broken"
    assert nx.observe_path(_probe("method"), _probe("connector")).outcome.value == "native"


def test_native_keys_match_the_contracts():
    from harness import contracts

    assert [c.id for c in nx.PER_MODEL_CONTRACTS] == list(contracts.NATIVE_PER_MODEL)
    assert nx.PATH_CONTRACT.id in contracts.NATIVE_GLOBAL


def test_layers_asked_gives_one_tensor_per_asked_id_and_names_a_wrong_file():
    """Both native readers (vLLM's LLM, speculators' client through vllm serve) split a file the same way."""
    import torch

    from harness.native.files import layers_asked

    hs = torch.arange(5 * 3 * 2, dtype=torch.float32).reshape(5, 3, 2)  # 5 tokens, distinct ids [2, 4, 7]
    data = {"hidden_states": hs, "token_ids": torch.arange(5)}
    got = layers_asked(data, "f.safetensors", [2, 4, 7], [7, 2, 2])
    assert [torch.equal(g, hs[:, i, :]) for g, i in zip(got, [2, 0, 0], strict=True)] == [True, True, True]
    with pytest.raises(ValueError, match=r"^f\.safetensors: expected hidden_states \[tokens, 4, hidden\]"):
        layers_asked(data, "f.safetensors", [1, 2, 4, 7], [1])
    with pytest.raises(ValueError, match=r"expected hidden_states \[6, 3, hidden\], the file holds"):
        layers_asked(data, "f.safetensors", [2, 4, 7], [2], tokens=6)
