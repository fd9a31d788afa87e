"""A vLLM model loader that needs no checkpoint on disk, for models too large to write out (Kimi-K2.5 at full depth,
~600 GB in INT4): `load_format="harness-seeded"`.

vLLM's own `dummy` loader is no model to measure: it fills every floating-point weight (norms and quantization scales
included) from one range, +-1e-3, so each layer's update is below bf16's resolution of the residual stream and every
layer's states look alike; and it leaves integer parameters as allocated (`torch.empty`): an INT4 checkpoint's packed
expert weights (`*weight_packed`, int32 holding eight 4-bit values) would hold whatever the allocator returned. This
loader writes every tensor itself, each from a generator seeded by the tensor's name, at a trained model's scales
(`seed_weights`): norm weights 1; group-wise quantization scales positive, so that a dequantized INT4 weight has the
spread of the bf16 ones; packed INT4 weights centred like trained ones (codes -7..7 equally likely and 0 twice as
likely: mean 0; offset-binary nibble 0, code -8, is written as code 0); other floating-point weights
uniform with standard deviation `WEIGHT_STD` (the usual initialisation); the other integer tensors (a packed scheme's
recorded shapes and activation-order indices, which a group-wise scheme without activation order never reads) zero.
vLLM then repacks the weights for its quantized kernels exactly as it does after a real load.

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


#: Standard deviation of the seeded bf16 weights (uniform in +-WEIGHT_STD*sqrt(3)); a dequantized INT4 weight
#: (codes -7..7 and 0 twice, standard deviation ~4.18, times its group's scale) gets about the same.
WEIGHT_STD = 0.02
INT4_CODE_STD = 4.18


def centred_int4(words):
    """`words` (int32, eight offset-binary nibbles each) with every nibble 0 (code -8) made 8 (code 0): uniform
    random nibbles then give codes -7..7 with 0 twice as likely, mean 0 (uniform -8..7 has mean -0.5, a bias every
    INT4 expert's output would sum up)."""
    for shift in range(0, 32, 4):
        zero = ((words >> shift) & 0xF) == 0
        words |= zero.to(words.dtype) << (shift + 3)
    return words


def seed_weights(model) -> dict:
    """Every tensor of `model` (its state dict: parameters and persistent buffers, as vLLM's dummy loader sees
    them) seeded by name at a trained model's scales (the module docstring); returns how many of each kind."""
    import torch

    counts = {"norm": 0, "scale": 0, "packed": 0, "weight": 0, "zeroed": 0}
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.device.type == "meta" or tensor.dtype == torch.bool or tensor.numel() == 0:
                continue
            gen = torch.Generator(device=tensor.device)
            gen.manual_seed(zlib.crc32(name.encode()))
            if tensor.is_floating_point():
                if tensor.dim() == 1 and "norm" in name:
                    tensor.fill_(1.0)
                    counts["norm"] += 1
                elif name.endswith("weight_scale"):
                    scale = WEIGHT_STD / INT4_CODE_STD
                    tensor.uniform_(0.5 * scale, 1.5 * scale, generator=gen)
                    counts["scale"] += 1
                else:
                    bound = WEIGHT_STD * 3**0.5
                    tensor.uniform_(-bound, bound, generator=gen)
                    counts["weight"] += 1
            elif name.endswith("weight_packed") and tensor.dtype == torch.int32:
                rows = tensor.view(tensor.shape[0], -1) if tensor.dim() > 1 else tensor.view(1, -1)
                for row in rows:  # one row (an expert) at a time: no temporary the size of all experts
                    row.copy_(
                        centred_int4(
                            torch.randint(
                                -(2**31),
                                2**31 - 1,
                                tuple(row.shape),
                                dtype=torch.int32,
                                device=row.device,
                                generator=gen,
                            )
                        )
                    )
                counts["packed"] += 1
            else:
                tensor.zero_()
                counts["zeroed"] += 1
    return counts


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
        """Every weight seeded by name at a trained model's scales (see the module docstring); vLLM's dummy loader
        lends the rest (its model construction, the repacking after the load)."""

        def load_weights(self, model, model_config) -> None:
            seed_weights(model)


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
