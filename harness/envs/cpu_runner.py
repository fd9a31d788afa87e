"""Which of vLLM's CPU model runners a run uses, where the env says it must choose (a vLLM platform plugin).

From vLLM 0.34 the x86 CPU worker builds the Triton V2 runner and refuses to start without triton-cpu ("vLLM's
model runner requires Triton", vllm/v1/worker/gpu_worker.py), which only GitHub serves; vLLM's own standalone
no-Triton V2 CPU runner (vllm/v1/worker/cpu/standalone_model_runner.py) is selected only on other CPUs
(`CpuPlatform.uses_standalone_cpu_model_runner`). An env that cannot have triton-cpu sets
`HARNESS_CPU_RUNNER=standalone`; this plugin then activates a CPU platform that differs in two places: it
selects the standalone runner whenever Triton is absent, on x86 too, and its config check skips the refusal of x86
without Triton (which guards the Triton runner it no longer builds). Unset, the plugin declines and vLLM chooses
its platform as always. Every report of such a run says so (`harness.installed.versions.runtime`): it observed vLLM's
standalone CPU runner, not the x86 Triton runner users of a vLLM CPU wheel get.

Registered under vLLM's `vllm.platform_plugins` entry point (pyproject.toml); vLLM resolves platform plugins in
every process it starts, so the engine core and every worker see the same choice.
"""

from __future__ import annotations

import os

VARIABLE = "HARNESS_CPU_RUNNER"
STANDALONE = "standalone"


def requested() -> bool:
    return os.environ.get(VARIABLE, "") == STANDALONE


def platform() -> str | None:
    """The plugin: the qualified name of the platform class, or None to let vLLM choose."""
    if not requested():
        return None
    from vllm.platforms import cpu_platform_plugin

    if cpu_platform_plugin() is None:  # not a CPU build: nothing to choose
        return None
    return f"{__name__}.StandaloneRunnerCpuPlatform"


def __getattr__(name: str):
    """The platform class, built on first use so that importing this module never imports vLLM."""
    if name != "StandaloneRunnerCpuPlatform":
        raise AttributeError(name)
    from vllm.platforms.cpu import CpuPlatform

    class StandaloneRunnerCpuPlatform(CpuPlatform):
        """vLLM's CPU platform, selecting the standalone runner wherever Triton is absent."""

        @classmethod
        def uses_standalone_cpu_model_runner(cls) -> bool:
            from vllm.triton_utils import HAS_TRITON

            return not HAS_TRITON

        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            """vLLM's own, but for its refusal of x86 without Triton ("vLLM on x86 CPUs requires Triton"), which
            guards the Triton runner this platform does not build: Triton reads as present for that one check,
            and only while it runs."""
            import vllm.triton_utils as triton_utils

            if triton_utils.HAS_TRITON:
                return super().check_and_update_config(vllm_config)
            triton_utils.HAS_TRITON = True
            try:
                return super().check_and_update_config(vllm_config)
            finally:
                triton_utils.HAS_TRITON = False

    globals()[name] = StandaloneRunnerCpuPlatform
    return StandaloneRunnerCpuPlatform
