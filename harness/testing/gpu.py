"""The GPU tier's options, the `multi_gpu(n)` mark (it acts: skipped with the reason where this host has
fewer GPUs), and the rule that an asked-for GPU run skips only for documented reasons."""

from __future__ import annotations

import pytest


def gpu_config(config):
    """The GPU tier's configuration: command-line options over HARNESS_GPU_* variables."""
    from harness.gpu.tier import TierConfig

    layer_ids = config.getoption("--layer-ids")
    return TierConfig.from_env(
        model_path=config.getoption("--model-path"),
        tp=config.getoption("--tp"),
        layer_ids=[int(x) for x in layer_ids.split(",")] if layer_ids else None,
        dtype=config.getoption("--dtype"),
        prompts_file=config.getoption("--prompts"),
        report_dir=config.getoption("--gpu-report-dir"),
        attention_backend=config.getoption("--attention-backend"),
        gpu_memory_utilization=config.getoption("--gpu-memory-utilization"),
        throughput_pairs=config.getoption("--throughput-pairs"),
    )


def gpus_on_this_host() -> int:
    """CUDA devices torch sees here (0 without CUDA)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable torch: no GPUs
        return 0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`multi_gpu(n)` acts: a test that needs more GPUs of one host than this one has is skipped with that
    reason (a gap that makes the run incomplete, never a pass), before it starts anything."""
    needs = [(item, int(m.args[0])) for item in items for m in [item.get_closest_marker("multi_gpu")] if m]
    if not needs or gpu_config(config).allow_cpu:  # a dry run of the tier's code on a CPU build asked for none
        return
    have = gpus_on_this_host()
    for item, n in needs:
        if n > have:
            item.add_marker(pytest.mark.skip(reason=f"needs {n} GPUs of one host, this host has {have}"))


def hold_gpu_skip(item, report) -> None:
    """A GPU run that was asked for (a model path given) may skip only for the documented reasons."""
    if not report.skipped or item.get_closest_marker("gpu") is None:
        return
    from harness.gpu.tier import ALLOWED_SKIPS

    if not gpu_config(item.config).model_path:
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(allowed in reason for allowed in ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"the GPU tier was asked for (model path given) but skipped for another reason: {reason}"
