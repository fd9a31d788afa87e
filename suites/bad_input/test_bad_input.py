"""Bad input gets a clear error, and nothing is left behind (no half-built generator, no worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.runtime.executor_view import WorkerTimeout
from harness.runtime.generator import HarnessGenerator, Options
from harness.runtime.inputs import HarnessInputError, TruncationWarning
from harness.support.paths import REPO_ROOT
from harness.testing import ahead

LLAMA = "tiny-llama"


def test_missing_model_path(tmp_path):
    with pytest.raises(HarnessInputError, match="not a local checkpoint folder"):
        HarnessGenerator(tmp_path / "no-such-model")


def test_checkpoint_without_weights_is_refused_before_start(runs, tmp_path):
    """A folder with the model's config and tokenizer but no weights: one line naming what is missing, at once
    (it used to fail ~30 s later as a generic worker start-up error)."""
    import shutil
    import time

    src = runs(LLAMA).model.path
    for f in src.iterdir():
        if not f.name.endswith((".safetensors", ".bin", ".pt")):
            shutil.copy(f, tmp_path / f.name) if f.is_file() else shutil.copytree(f, tmp_path / f.name)
    t0 = time.monotonic()
    with pytest.raises(HarnessInputError, match=r"has a config.json but no weights \(\*.safetensors"):
        HarnessGenerator(tmp_path, [1])
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("layer_ids", [[6], [-1], [0, 99]])
def test_layer_id_out_of_range(layer_ids, runs):
    with pytest.raises(HarnessInputError, match=r"out of range: the model has 6 decoder layers"):
        HarnessGenerator(runs(LLAMA).model.path, layer_ids)


@pytest.mark.parametrize(
    "states_on, says",
    [
        ("gpu", r"states_on must be one of host, device, got 'gpu'"),
        ("device", r"states_on='device' needs vLLM on CUDA; this vLLM runs on"),
    ],
)
def test_states_on_a_device_this_vllm_lacks_is_refused_before_start(states_on, says, runs):
    path = runs(LLAMA).model.path
    t0 = time.monotonic()
    with pytest.raises(HarnessInputError, match=says):
        HarnessGenerator(path, [1], options=Options(states_on=states_on))
    assert time.monotonic() - t0 < 5


def test_batch_invariant_extraction_on_a_cpu_vllm_is_refused_before_start(runs):
    """`Options(batch_invariant=True)` needs vLLM's batch-invariant kernels, which run on the GPU
    (harness.runtime.batch_invariant_norm): a CPU vLLM says so in one line and starts nothing."""
    t0 = time.monotonic()
    with pytest.raises(HarnessInputError, match=r"batch_invariant needs vLLM on CUDA .*; this vLLM runs on cpu"):
        HarnessGenerator(runs(LLAMA).model.path, [1], options=Options(batch_invariant=True))
    assert time.monotonic() - t0 < 5
    assert "VLLM_BATCH_INVARIANT" not in os.environ


def test_a_worker_without_cuda_refuses_the_device_hand_off_and_keeps_its_own(runs):
    """Asked for the device hand-off (harness.runtime.device_hand_off), a CPU worker says why and goes on handing
    the states over as before: the next batch's states arrive on the host, through the streamed hand-off."""
    gen = runs(LLAMA).generator

    def switch(mode: str) -> dict:
        return gen.real_executor.collective_rpc("_harness_set_transport", args=(mode,))[0]

    before = switch("stream")
    with pytest.raises(Exception, match="the device hand-off needs the worker on a CUDA device"):
        switch("device")
    out = gen.generate([[5, 6, 7, 8]])
    after = switch("stream")
    assert not out[0]["hidden_states"][0].is_cuda
    assert (after["streamed"] - before["streamed"], after["device"]) == (1, 0)


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

    from harness.support.processes import children

    run = runs(LLAMA)
    before = set(children())  # live, not a background job's (those come and go beside this test), no tracker
    gen = HarnessGenerator(run.model.path, [1], max_model_len=256)
    try:
        workers = [psutil.Process(pid) for pid in children() if pid not in before]
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
    out = subprocess.run(
        [sys.executable, "-m", "harness", "expectations"], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no expectations for vLLM" in out.stderr and "have: none" in out.stderr


@ahead.job("observed-run")
def _observed_run():
    """`harness run` on a subset with an empty expectations folder (in the background: harness.testing.ahead)."""
    env = ahead.env({**os.environ})
    env.pop("HARNESS_OBSERVE", None)

    def child() -> dict:
        with tempfile.TemporaryDirectory(prefix="harness-observed-") as tmp:
            tmp = Path(tmp)
            (tmp / "none").mkdir()
            draft = tmp / "reports" / "observed-x.expectations-draft.toml"

            def harness_run(run_env: dict) -> subprocess.CompletedProcess:
                return subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "harness",
                        "run",
                        "--env",
                        "observed-x",
                        "--",
                        "--harness-report-dir",
                        str(tmp / "reports"),
                        "-k",
                        "test_contract and schedcfg",
                    ],
                    capture_output=True,
                    text=True,
                    env=run_env,
                    timeout=600,
                )

            out = harness_run({**env, "HARNESS_EXPECTATIONS_DIR": str(tmp / "none")})
            got = {
                "rc": out.returncode,
                "stdout": out.stdout,
                "stderr": out.stderr,
                "report": _read(tmp / "reports" / "observed-x.json"),
                "draft": _read(draft),
            }
            # The same run, judged by the committed expectations: the observation's draft is spent.
            judged = harness_run(env)
            got["judged"] = {
                "rc": judged.returncode,
                "out": judged.stdout[-1500:] + judged.stderr[-1500:],
                "draft_left": draft.exists(),
            }
            return got

    return child


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


@pytest.mark.ahead("observed-run")
def test_vllm_without_expectations_is_observed_never_passed():
    """A build with no expectations file is observed, not refused: status `observed` (exit 4, never 0), a
    summary of what it showed, and a draft expectations file beside the report that says it is not reviewed."""
    out = ahead.result("observed-run")
    assert out["rc"] == 4, out["stdout"][-1500:] + out["stderr"][-1500:]
    assert "no expectations for vLLM" in out["stderr"] and "observing it" in out["stderr"]
    assert out["report"] is not None and out["draft"] is not None, "the observed run wrote no report or no draft"
    rep = json.loads(out["report"])
    assert rep["status"] == "observed" and rep["mode"] == "observed"
    assert "schedcfg" in out["stdout"] and "draft expectations for review" in out["stdout"]
    draft = out["draft"]
    assert draft.startswith("# DRAFT, NOT REVIEWED") and "schedcfg = { outcome =" in draft


@pytest.mark.ahead("observed-run")
def test_a_judged_run_removes_the_spent_draft():
    """Once the vLLM has expectations, its next (judged) run removes the observation's draft from the report
    folder: a draft left beside a passing report would read as work still to review."""
    judged = ahead.result("observed-run")["judged"]
    assert judged["rc"] == 0, judged["out"]
    assert not judged["draft_left"], "the judged run left the observed run's draft in reports/"


def test_strict_refuses_a_vllm_without_expectations(tmp_path):
    env = {**os.environ, "HARNESS_EXPECTATIONS_DIR": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--strict",
            "--env",
            "strict-x",
            "--",
            "--harness-report-dir",
            str(tmp_path / "reports"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "no expectations for vLLM" in lines[0], out.stderr[-1500:]
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize(
    "batch,says",
    [
        ([[5, 6.7, 7]], r"prompt 0 has token ids that are not ints: \[6.7\] \(float\)"),
        ([[5, "6", 7]], r"prompt 0 has token ids that are not ints: \['6'\] \(str\)"),
        ([[5, True, 7]], r"prompt 0 has token ids that are not ints: \[True\] \(bool\)"),
        ([[5, float("nan")]], r"prompt 0 has token ids that are not ints: \[nan\] \(float\)"),
        ([5, 6, 7], r"got a flat list of ints: wrap a single prompt as \[ids\]"),
        ("5 6 7", r"token ids must be a list of prompts \(lists of ints\), got str"),
        ([["5 6 7"][0]], r"prompt 0 must be a list of ints, got str"),
    ],
)
def test_token_ids_must_be_ints(batch, says, runs):
    """Only ints reach vLLM: 6.7, "6" and True were silently coerced to 6, 6 and 1."""
    gen = runs(LLAMA).generator
    with pytest.raises(HarnessInputError, match=says):
        gen.generate(batch)


def test_torch_and_numpy_integer_prompts_are_accepted(runs):
    import numpy as np
    import torch

    gen = runs(LLAMA).generator
    a = gen.generate(torch.tensor([[5, 6, 7]]))[0]["hidden_states"][0]
    b = gen.generate([np.array([5, 6, 7], dtype=np.int64)])[0]["hidden_states"][0]
    assert torch.equal(a, b) and a.shape[0] == 3


def _run_cli(tmp_path, text: str, observe: bool) -> subprocess.CompletedProcess:
    from harness.installed import versions

    (tmp_path / f"vllm-{versions.vllm_version()}-{versions.device_type()}.toml").write_text(text)
    env = {**os.environ, "HARNESS_EXPECTATIONS_DIR": str(tmp_path), "HARNESS_OBSERVE": "1" if observe else "0"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--env",
            "bad-exp",
            "--",
            "--harness-report-dir",
            str(tmp_path / "reports"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("observe", [False, True], ids=["strict", "observe"])
def test_malformed_expectations_file_is_one_line_exit_2(tmp_path, observe):
    """Checked before any test runs: exit 2, one line with file, line and column, no report written."""
    out = _run_cli(tmp_path, '[contracts]\nsched = { outcome = "native", reason = "x" }\nrpc = { outcome = \n', observe)
    assert out.returncode == 2, out.stdout[-500:] + out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert (
        len(lines) == 1 and lines[0].startswith("harness: ") and ".toml:3:" in lines[0] and "not valid TOML" in lines[0]
    )
    assert not (tmp_path / "reports").exists(), "a report was written for a run that was refused"


def _has_expectations() -> bool:
    from harness.installed import versions
    from harness.reporting import expectations

    return expectations.file_for(versions.vllm_version(), versions.device_type()).is_file()


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


#: The complete report an earlier run left, which an interrupted run must not replace.
_COMPLETE = {"env": "sigterm", "status": "pass", "note": "a complete earlier run"}


@ahead.job("sigterm-run")
def _sigterm_run():
    """`harness run` on the e2e suite, SIGTERM 2 s after its first worker exists (in the background:
    harness.testing.ahead); what it left: exit code, time to stop, survivors, both reports."""
    import signal

    import psutil

    job_env = ahead.env()

    def child() -> dict:
        with tempfile.TemporaryDirectory(prefix="harness-sigterm-") as tmp:
            reports = Path(tmp) / "reports"
            reports.mkdir()
            (reports / "sigterm.json").write_text(json.dumps(_COMPLETE))
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "harness",
                    "run",
                    "--env",
                    "sigterm",
                    "--suite",
                    "suites/e2e",
                    "--",
                    "-q",
                    "--harness-report-dir",
                    str(reports),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=job_env,
            )
            out, took, family = "", None, []
            try:
                deadline = time.monotonic() + 240
                workers = []
                while time.monotonic() < deadline and proc.poll() is None:
                    workers = [p for p in _descendants(proc.pid) if "resource_tracker" not in " ".join(p.cmdline())]
                    if workers:
                        break
                    time.sleep(1)
                if workers and proc.poll() is None:
                    time.sleep(2)  # inside the first tests
                    family = _descendants(proc.pid)
                    t0 = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
                    out, _ = proc.communicate(timeout=90)
                    took = time.monotonic() - t0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    out += proc.communicate()[0] or ""
            gone, alive = psutil.wait_procs(family, timeout=10)
            alive = [p.pid for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            return {
                "interrupted": took is not None,
                "took": took,
                "rc": proc.returncode,
                "out": out,
                "alive": alive,
                "complete": _read(reports / "sigterm.json"),
                "incomplete": _read(reports / "sigterm.incomplete.json"),
            }

    return child


@pytest.mark.ahead("sigterm-run")
def test_sigterm_stops_the_run_at_once_and_keeps_the_complete_report():
    """SIGTERM during a run: workers stop at once, the report says interrupted/incomplete, and it does not
    replace the complete report of the same env (it goes to <env>.incomplete.json)."""
    r = ahead.result("sigterm-run")
    assert r["interrupted"], "the run started no worker (or ended) before it could be interrupted: " + r["out"][-1500:]
    assert not r["alive"], f"processes outlived the interrupted run: {r['alive']}"
    assert r["rc"] == 3, r["out"][-2000:]
    assert r["incomplete"] is not None, "the interrupted run wrote no <env>.incomplete.json"
    assert r["complete"] is not None and json.loads(r["complete"]) == _COMPLETE, "the complete report was replaced"
    rep = json.loads(r["incomplete"])
    held = _has_expectations()  # a build without them is observed: status `observed`, still interrupted
    assert rep["status"] == ("incomplete" if held else "observed") and rep["interrupted"] == "SIGTERM"
    assert any(g["kind"] == "interrupted" for g in rep["incomplete"])
    assert r["took"] < 60, f"the run took {r['took']:.0f} s to stop after SIGTERM"


def test_an_env_name_that_is_not_the_installed_vllm_s_is_refused():
    """`harness run --env <name>` files its report as reports/<name>.*: a name that is no env of the installed vLLM
    would run the whole suite and write a report nothing reads (or file it under another build): refused at once."""
    reports = REPO_ROOT / "reports"  # absent in a fresh directory where the installed package runs: it stays so

    def listed() -> list[str] | None:
        return sorted(p.name for p in reports.iterdir()) if reports.is_dir() else None

    before = listed()
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--env", "nonexistent"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--env nonexistent is no env of fixtures/envs/matrix.toml" in lines[0], out.stderr
    assert listed() == before
