"""The suites' pytest plugin (`pytest_plugins = ["harness.testing.plugin"]`): environment defaults, markers, and the
fixtures and hooks of the modules beside it (recording, leaks, session_report, gpu), registered here. Its options
live in harness.testing.options, which is also the package's `pytest11` entry point (options only: a user's other
test runs are left as they are)."""

from __future__ import annotations

import os

import pytest

from harness.testing import session_report
from harness.testing.gpu import gpu_config, hold_gpu_skip, pytest_collection_modifyitems  # noqa: F401
from harness.testing.leaks import no_leftover_shared_memory, no_leftover_workers, pytest_runtest_protocol  # noqa: F401
from harness.testing.recording import (  # noqa: F401
    expectations,
    harness_meta,
    numerics_expected,
    record_e2e,
    record_note,
    record_observation,
    record_proof,
)
from harness.testing.session_report import (  # noqa: F401
    pytest_collection_finish,
    pytest_deselected,
    pytest_keyboard_interrupt,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_xdist_node_collection_finished,  # noqa: F401
    report_generator_starts,
)

#: Offline and small: no hub lookups, a 1 GiB KV cache on CPU (vLLM would otherwise reserve half the RAM), and idle
#: workers that sleep instead of spinning on their message queue (several shared generators wait idle while one
#: works: spinning ones take the CPU it needs). Workers are spawned, never forked: a forked worker cannot use CUDA
#: once the driver has touched it (seen on the H200 with vLLM 0.20). Defaults only: a value already set wins.
pytest_plugins = ["harness.testing.options", "harness.testing.rows"]

#: The markers the suites use (also in pyproject.toml for the checkout; registered here for the installed suites).
MARKERS = (
    "gpu: needs CUDA GPUs and a CUDA build of vLLM (the GPU tier)",
    "multi_gpu(n): needs n GPUs on one host",
    "vllm: needs an installed vLLM (conformance suites)",
    "xdist_group(name): keep tests sharing a generator on one pytest-xdist worker",
)

ENV_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_SLEEP_WHEN_IDLE": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """The environment defaults, at configure: before any test module is collected (and imports vLLM, which
    reads some of them at import); importing the plugin changes nothing. Then the session report's set-up."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    session_report.pytest_configure(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    hold_gpu_skip(item, report)
    report_generator_starts(report)
