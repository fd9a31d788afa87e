"""The suites' pytest plugin (`pytest_plugins = ["harness.testing.plugin"]`): environment defaults, options,
and the fixtures and hooks of the modules beside it (recording, leaks, session_report, gpu), registered here."""

from __future__ import annotations

import os

import pytest

from harness.paths import REPORTS
from harness.testing import session_report
from harness.testing.gpu import gpu_config, hold_gpu_skip, pytest_collection_modifyitems  # noqa: F401
from harness.testing.leaks import no_leftover_shared_memory, no_leftover_workers, pytest_runtest_protocol  # noqa: F401
from harness.testing.recording import (expectations, harness_meta, numerics_expected, record_e2e,  # noqa: F401
                                      record_note, record_observation, record_proof)
from harness.testing.session_report import (report_generator_starts, pytest_collection_finish,  # noqa: F401
                                           pytest_xdist_node_collection_finished, pytest_deselected,  # noqa: F401
                                           pytest_keyboard_interrupt, pytest_runtest_logreport, pytest_sessionfinish)


#: Offline and small: no hub lookups, a 1 GiB KV cache on CPU (vLLM would otherwise reserve half the RAM), and idle
#: workers that sleep instead of spinning on their message queue (several shared generators wait idle while one
#: works: spinning ones take the CPU it needs). Workers are spawned, never forked: a forked worker cannot use CUDA
#: once the driver has touched it (seen on the H200 with vLLM 0.20). Defaults only: a value already set wins.
ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_SLEEP_WHEN_IDLE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "TOKENIZERS_PARALLELISM": "false",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """The environment defaults, at configure: before any test module is collected (and imports vLLM, which
    reads some of them at import); importing the plugin changes nothing. Then the session report's set-up."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    session_report.pytest_configure(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    hold_gpu_skip(item, report)
    report_generator_starts(report)


def pytest_addoption(parser):
    g = parser.getgroup("harness")
    g.addoption("--harness-env", default=os.environ.get("HARNESS_ENV", "local"), help="env name for reports/<env>.json")
    g.addoption("--harness-report-dir", default=str(REPORTS), help="where the env report goes")
    g.addoption("--harness-no-report", action="store_true", help="do not write reports/<env>.*")
    gpu = parser.getgroup("harness GPU tier (-m gpu)")
    gpu.addoption("--model-path", help="checkpoint folder (env HARNESS_GPU_MODEL_PATH)")
    gpu.addoption("--tp", type=int, help="tensor_parallel_size (env HARNESS_GPU_TP, default 8)")
    gpu.addoption("--layer-ids", help="comma-separated layer ids (env HARNESS_GPU_LAYER_IDS; default: speculators' choice)")
    gpu.addoption("--dtype", help="bfloat16 | float16 | float32 (env HARNESS_GPU_DTYPE, default bfloat16)")
    gpu.addoption("--prompts", help="prompt set JSON (env HARNESS_GPU_PROMPTS; default fixtures/prompts/gpu-prompts.json)")
    gpu.addoption("--gpu-report-dir", help="where the dated report goes (env HARNESS_GPU_REPORT_DIR; default reports/gpu)")
    gpu.addoption("--attention-backend", help="e.g. TRITON_MLA (env HARNESS_GPU_ATTENTION_BACKEND; default vLLM's)")
    gpu.addoption("--gpu-memory-utilization", type=float, help="(env HARNESS_GPU_MEMORY_UTILIZATION; default 0.8)")
    gpu.addoption("--throughput-pairs", type=int, help="timed calls a side of extraction vs plain prefill, 0: none "
                                                       "(env HARNESS_GPU_THROUGHPUT_PAIRS, default 5)")
