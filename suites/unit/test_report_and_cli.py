"""Reports are written atomically; the CLI says clearly when it cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.reporting import report


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "r.json"
    report.write_atomic(target, "one")
    report.write_atomic(target, "two")
    assert target.read_text() == "two" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_markdown_marks_mismatches(tmp_path):
    c = {
        "contract": "sched",
        "outcome": "broken",
        "expected": "shimmed",
        "shim": None,
        "reason": "r",
        "unshimmed": {"ok": False, "error": "TypeError: x"},
    }
    rep = report.build("e", {"vllm": "0.16.0"}, [c], [], {}, {"failed": 0}, [], [], "f.toml", [])
    assert rep["status"] == "fail" and rep["mismatched"] == ["sched"]
    j, m = report.write(rep, tmp_path)
    assert "**MISMATCH**" in m.read_text() and json.loads(j.read_text())["schema"] == report.SCHEMA


def test_run_without_vllm_exits_2_with_a_clear_message():
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run"], capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert out.returncode == 2
    assert "vLLM is not installed in this environment" in out.stderr


def test_error_texts_and_gpu_config_carry_no_machine_paths():
    """Reports are committed: an ImportError's file and the prompts file are recorded without this machine's prefix."""
    from harness.contracts.base import summarize
    from harness.gpu import tier as gpu_tier
    from harness.support.paths import REPO_ROOT

    err = (
        "cannot import name 'x' from 'vllm.a' (/home/u/proj/.tox/e/lib/python3.11/site-packages/vllm/a.py); "
        f"see {REPO_ROOT}/harness/runtime/worker.py"
    )
    assert summarize(err) == "cannot import name 'x' from 'vllm.a' (vllm/a.py); see harness/runtime/worker.py"
    cfg = gpu_tier.TierConfig(model_path=None)
    assert gpu_tier.asdict_config(cfg)["prompts_file"] == "fixtures/prompts/gpu-prompts.json"
    outside = gpu_tier.asdict_config(gpu_tier.TierConfig(model_path="/models/Kimi-K2.5", report_dir="/root/out/gpu"))
    assert (outside["model_path"], outside["report_dir"]) == ("<outside the repo>/Kimi-K2.5", "<outside the repo>/gpu")
    import sys

    sys.path.insert(0, "/tmp/site")  # a --target install on PYTHONPATH, as on the GPU machine
    try:
        assert summarize("1 0.1 0.2 /tmp/site/vllm/v1/executor/multiproc_executor.py:339(collective_rpc)") == (
            "1 0.1 0.2 vllm/v1/executor/multiproc_executor.py:339(collective_rpc)"
        )
    finally:
        sys.path.remove("/tmp/site")


def test_reports_hold_no_machine_paths_even_when_site_packages_lies_in_the_checkout():
    from harness.reporting.report import unmachined
    from harness.support.paths import REPO_ROOT

    error = f"cannot import name 'x' from 'vllm.a' ({REPO_ROOT}/.tox/e/lib/python3.11/site-packages/vllm/a.py)"
    assert unmachined({"e": [error]}) == {"e": ["cannot import name 'x' from 'vllm.a' (vllm/a.py)"]}
    assert unmachined(f"see {REPO_ROOT}/reports/x.md") == "see reports/x.md"
