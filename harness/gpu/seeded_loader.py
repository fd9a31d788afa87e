"""A vLLM model loader that needs no checkpoint on disk, for models too large to write out (Kimi-K2.5 at full depth,
~600 GB in INT4): `load_format="harness-seeded"`.

vLLM's own `dummy` loader fills floating-point weights from a fixed seed but leaves integer parameters as they were
allocated (`torch.empty`): an INT4 checkpoint's packed expert weights (`*weight_packed`, int32 holding eight 4-bit
values) would hold whatever the allocator returned, so two runs of the same model differ. This loader runs vLLM's
dummy fill, then gives every packed integer weight values from a generator seeded by the parameter's name (all 16
nibble codes equally likely), and zeroes the other integer parameters (a packed scheme's recorded shapes and
activation-order indices, which a group-wise scheme without activation order never reads). vLLM then repacks the
weights for its quantized kernels exactly as it does after a real load.

A model folder opts in with a file `harness-seeded.json` beside its config.json (harness.runtime.inputs reads it);
the loader reaches vLLM's worker processes as a vLLM general plugin (the `vllm.general_plugins` entry point
`harness_seeded_loader`, loaded by vLLM in every process it starts).
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

LOAD_FORMAT = "harness-seeded"
#: The entry point pyproject.toml declares (group, name, target); `write_entry_point` writes the same for a checkout.
ENTRY_POINT = ("vllm.general_plugins", "harness_seeded_loader", "harness.gpu.seeded_loader:register")


def fill_integers(model) -> dict:
    """Seeded values into `model`'s packed integer weights, zeros into its other integer tensors; returns counts."""
    import torch

    packed = zeroed = 0
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point() or tensor.device.type == "meta" or tensor.dtype == torch.bool:
                continue
            if name.endswith("weight_packed") and tensor.dtype == torch.int32:
                gen = torch.Generator(device=tensor.device)
                gen.manual_seed(zlib.crc32(name.encode()))
                tensor.copy_(torch.randint(-2**31, 2**31 - 1, tuple(tensor.shape), dtype=torch.int32,
                                           device=tensor.device, generator=gen))
                packed += 1
            else:
                tensor.zero_()
                zeroed += 1
    return {"packed": packed, "zeroed": zeroed}


def register() -> None:
    """The vLLM general-plugin hook: register the loader once per process, only where the harness asked for it
    (SEEDED_ENV, set before it starts an engine on a seeded folder and inherited by vLLM's processes): vLLM loads
    general plugins in every process of every environment the harness is installed in, and importing its loader
    package there costs ~200 MB of host memory a process for nothing."""
    from harness.runtime.inputs import SEEDED_ENV

    if os.environ.get(SEEDED_ENV) != "1":
        return
    try:
        from vllm.model_executor import model_loader
        from vllm.model_executor.model_loader import DummyModelLoader, register_model_loader
    except ImportError:
        return
    registry = getattr(model_loader, "_LOAD_FORMAT_TO_MODEL_LOADER", {})
    if LOAD_FORMAT in registry:
        return

    @register_model_loader(LOAD_FORMAT)
    class SeededModelLoader(DummyModelLoader):
        """vLLM's dummy weights, then the packed integers seeded by name (see the module docstring)."""

        def load_weights(self, model, model_config) -> None:
            super().load_weights(model, model_config)
            fill_integers(model)


def write_entry_point(site: Path) -> Path:
    """Distribution metadata in `site` declaring ENTRY_POINT, for a checkout run from PYTHONPATH (the GPU machine):
    vLLM finds general plugins through entry points, which only installed distributions have."""
    dist = Path(site) / "speculators_vllm_harness_plugins-0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: speculators-vllm-harness-plugins\nVersion: 0\n")
    group, name, target = ENTRY_POINT
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    return dist


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--entry-point-into":
        print("usage: python -m harness.gpu.seeded_loader --entry-point-into SITE_DIR", file=sys.stderr)
        sys.exit(2)
    print(write_entry_point(Path(sys.argv[2])))
