"""The harness's pytest options, and nothing else: the package's `pytest11` entry point.

Installed, pytest loads this module in every run; it only adds the options below (no fixtures, no hooks that act,
no environment changes), so a team's other test runs are unaffected. The suites' plugin (harness.testing.plugin,
which the shipped suites' conftest loads) pulls it in where the entry point is absent (a checkout on PYTHONPATH).
"""

from __future__ import annotations

import os

from harness.support.paths import REPORTS


def pytest_addoption(parser):
    g = parser.getgroup("harness")
    g.addoption("--harness-env", default=os.environ.get("HARNESS_ENV", "local"), help="env name for reports/<env>.json")
    g.addoption("--harness-report-dir", default=str(REPORTS), help="where the env report goes")
    g.addoption("--harness-no-report", action="store_true", help="do not write reports/<env>.*")
    g.addoption("--harness-only-rows", help="run only the tests observing these report rows (comma-separated)")
    g.addoption("--harness-only-models", help="run only the tests observing these tiny models' rows (comma-separated)")
    g.addoption("--harness-tp", type=int, default=2, help="tensor_parallel_size of the TP rows (suites/e2e, CPU build)")
    g.addoption("--harness-tp-models", help="tiny models the TP rows run (comma-separated; default the suite's)")
    gpu = parser.getgroup("harness GPU tier (-m gpu)")
    gpu.addoption("--model-path", help="checkpoint folder (env HARNESS_GPU_MODEL_PATH)")
    gpu.addoption("--tp", type=int, help="tensor_parallel_size (env HARNESS_GPU_TP, default 8)")
    gpu.addoption(
        "--layer-ids", help="comma-separated layer ids (env HARNESS_GPU_LAYER_IDS; default: speculators' choice)"
    )
    gpu.addoption("--dtype", help="bfloat16 | float16 | float32 (env HARNESS_GPU_DTYPE, default bfloat16)")
    gpu.addoption(
        "--prompts", help="prompt set JSON (env HARNESS_GPU_PROMPTS; default fixtures/prompts/gpu-prompts.json)"
    )
    gpu.addoption(
        "--gpu-report-dir", help="where the dated report goes (env HARNESS_GPU_REPORT_DIR; default reports/gpu)"
    )
    gpu.addoption("--attention-backend", help="e.g. TRITON_MLA (env HARNESS_GPU_ATTENTION_BACKEND; default vLLM's)")
    gpu.addoption("--gpu-memory-utilization", type=float, help="(env HARNESS_GPU_MEMORY_UTILIZATION; default 0.8)")
    gpu.addoption(
        "--throughput-pairs",
        type=int,
        help="timed calls a side of extraction vs plain prefill, 0: none (env HARNESS_GPU_THROUGHPUT_PAIRS, default 5)",
    )
