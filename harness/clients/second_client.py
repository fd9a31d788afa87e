"""Ground truth from a second client: speculators 0.4.0's own generator, which ported the same fixes upstream.

speculators 0.4.0 adapted its in-process generator to vLLM 0.12-0.16 itself (two-phase execution,
block hashes, single-reply RPC, ...). Run unshimmed in a vLLM it supports, its hidden states must
equal ours (speculators 0.3.0 through the harness's shims) on the same prompts.

Both releases are the package `speculators`, so 0.4.0 runs in a child interpreter whose path puts
the unpacked 0.4.0 wheel first (its vLLM workers inherit that path). Two things are changed in it,
neither a vLLM contract: on a CPU build its `mem_get_info()` sees no accelerator and returns 0 bytes
(the platform's KV-cache space is given instead), and the dtype is pinned to float32 (an option, as
for ours). Its supported vLLM range is read from its own wheel metadata.

    python -m harness.clients.second_client --wheel-dir DIR --model PATH --layers 1,3 --prompts FILE --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.support.paths import SOURCE_ROOT

VERSION = "0.4.0"


def wheel_dir() -> Path:
    """speculators 0.4.0 unpacked, not installed (downloaded once into .cache/)."""
    from harness.envs.wheels import wheel_tree

    return wheel_tree("speculators", VERSION)


def supported_range(tree: Path) -> str:
    """The vLLM range 0.4.0 declares for its data generation (its `datagen` extra)."""
    meta = next(tree.glob("speculators-*.dist-info")) / "METADATA"
    for line in meta.read_text().splitlines():
        if line.startswith("Requires-Dist: vllm") and 'extra == "datagen"' in line:
            return line.split("vllm", 1)[1].split(";")[0].strip()
    raise LookupError(f"{meta} declares no vLLM range for datagen")


def supports_installed_vllm(tree: Path) -> tuple[bool, str]:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from harness.installed.versions import vllm_version

    spec, installed = supported_range(tree), vllm_version()
    release = Version(".".join(map(str, Version(installed).release[:3])))  # 0.11.1.post2 -> 0.11.1
    return release in SpecifierSet(spec), f"speculators {VERSION} declares vllm{spec}; installed {installed}"


def run_child(
    tree: Path, model_path: Path, layers: list[int], prompts: list[list[int]], out: Path, base_env: dict | None = None
) -> Path:
    """Run 0.4.0's generator in a child interpreter (environment `base_env`, else this one's), importing nothing
    in this process (safe on a background thread); returns `out`, the file it wrote (read it with `load`:
    {"hidden_states": [[per layer] per prompt]})."""
    spec = out.with_suffix(".prompts.json")
    spec.write_text(json.dumps(prompts))
    base = os.environ if base_env is None else base_env
    env = {**base, "PYTHONPATH": os.pathsep.join([str(tree), str(SOURCE_ROOT), base.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.clients.second_client",
            "--model",
            str(model_path),
            "--layers",
            ",".join(map(str, layers)),
            "--prompts",
            str(spec),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"speculators {VERSION}'s generator failed: {proc.stderr.strip().splitlines()[-5:]}")
    return out


def load(data: bytes) -> dict:
    """The child's result file's bytes as torch objects."""
    import io

    import torch

    return torch.load(io.BytesIO(data))


def _child(args) -> int:
    """In the child: speculators here is 0.4.0 (first on the path)."""
    import speculators
    import speculators.data_generation.vllm_hidden_states_generator as mod
    import torch

    from harness.contracts.memory import platform_mem_get_info
    from harness.support.namespace import rebind

    real_model_config = mod.ModelConfig

    def ModelConfig(**kwargs):  # noqa: N802 - the dtype option, as for our generator
        kwargs["dtype"] = "float32"
        return real_model_config(**kwargs)

    overrides: dict[str, Any] = {"ModelConfig": ModelConfig}
    if not torch.cuda.is_available():
        overrides["mem_get_info"] = platform_mem_get_info
    cls = rebind(mod.VllmHiddenStatesGenerator, overrides)
    prompts = json.loads(Path(args.prompts).read_text())
    gen = cls(args.model, [int(x) for x in args.layers.split(",")], max_model_len=512)
    try:
        results = gen.generate(prompts)
    finally:
        gen.executor.shutdown()
    torch.save(
        {
            "speculators_file": speculators.__file__,
            "hidden_states": [[h.float() for h in r["hidden_states"]] for r in results],
            "input_ids": [r["input_ids"].tolist() for r in results],
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--layers", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rc = _child(a)
    sys.stdout.flush()
    os._exit(rc)
