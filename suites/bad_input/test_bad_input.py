"""Bad input gets a clear error, and nothing is left behind (no half-built generator, no worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from harness.generator import HarnessGenerator, HarnessInputError, TruncationWarning
from harness.executor_view import WorkerTimeout

LLAMA = "tiny-llama"


def test_missing_model_path(tmp_path):
    with pytest.raises(HarnessInputError, match="not a local checkpoint folder"):
        HarnessGenerator(tmp_path / "no-such-model")


@pytest.mark.parametrize("layer_ids", [[6], [-1], [0, 99]])
def test_layer_id_out_of_range(layer_ids, runs):
    with pytest.raises(HarnessInputError, match=r"out of range: the model has 6 decoder layers"):
        HarnessGenerator(runs(LLAMA).model.path, layer_ids)


def test_empty_batch_and_empty_prompt(runs):
    gen = runs(LLAMA).generator
    with pytest.raises(HarnessInputError, match="empty batch"):
        gen.generate([])
    with pytest.raises(HarnessInputError, match="prompt 1 is empty"):
        gen.generate([[5, 6, 7], []])


def test_token_id_outside_vocabulary(runs):
    run = runs(LLAMA)
    with pytest.raises(HarnessInputError, match=r"outside the vocabulary \[0, 512\)"):
        run.generator.generate([[5, 6, run.model.vocab_size]])
    # The generator is still usable afterwards: nothing reached vLLM.
    assert run.generator.generate([[5, 6, 7]])[0]["hidden_states"][0].shape[0] == 3


def test_prompt_longer_than_max_model_len_is_reported(runs):
    gen = runs(LLAMA).generator
    n = gen.max_model_len + 20
    with pytest.warns(TruncationWarning, match=f"prompt 0 has {n} tokens"):
        res = gen.generate([[(i % 400) + 4 for i in range(n)]])
    assert res[0]["truncated_from"] == n
    assert all(h.shape[0] == gen.max_model_len - 1 for h in res[0]["hidden_states"])


def test_hung_worker_times_out_and_executor_is_shut_down(runs):
    """A worker that stops answering: a clear WorkerTimeout, and the executor's workers are gone."""
    import psutil

    run = runs(LLAMA)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    gen = HarnessGenerator(run.model.path, [1], max_model_len=256)
    try:
        workers = [p for p in psutil.Process().children(recursive=True)
                   if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())]
        assert workers, "the generator started no worker process"
        gen.real_executor.collective_rpc("_harness_hang_next", args=("_reset_capture", 120))
        gen.executor_view.rpc_timeout_s = 3
        t0 = time.monotonic()
        with pytest.raises(WorkerTimeout, match=r"did not answer RPC '_reset_capture' within 3 s; executor shut down"):
            gen.generate([[5, 6, 7]])
        assert time.monotonic() - t0 < 60
        assert gen.executor_view.closed
    finally:
        gen.close()
    gone, alive = psutil.wait_procs([w for w in workers if w.is_running()], timeout=20)
    assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_vllm_version_without_expectations(tmp_path):
    """The CLI refuses to judge a vLLM it has no expectations for, and says which ones it has."""
    env = {**os.environ, "HARNESS_EXPECTATIONS_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "harness", "expectations"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no expectations for vLLM" in out.stderr and "have: none" in out.stderr
