"""`Options(batch_invariant=True)` (harness.runtime.generator): vLLM's batch-invariant mode for the engine's workers,
and a residual-add RMSNorm that is batch invariant in place of the one that mode still runs.

With `VLLM_BATCH_INVARIANT=1`, vLLM sends every RMSNorm through `rms_norm_batch_invariant`; since vllm-project/vllm
#40413 (and #42453, which moved the branch into that function) the residual-add case calls the fused CUDA kernel
`fused_add_rms_norm`, taken to be batch invariant. It is not: its launcher picks the block size from the forward's
token count (1024 threads under 256 tokens, 256 from there on, vllm-project/vllm#27931), and the block size sets the
order of each row's variance reduction (vllm-project/vllm#48271; fixed upstream by pinning it, #48391). Measured on
an H100 with vLLM 0.25.0 (benchmarks/gpu_batch_invariance.py): with the mode on, a prompt's states alone and in a
batch differed in 52 of 60 random calls, and harness.gpu.module_determinism named a decoder layer's
`post_attention_layernorm` as the first module whose rows changed on equal input rows, every time.

`engage` (run in each worker where vLLM's mode is on) puts `invariant_residual_norm` in that function's place: the
residual add, then vLLM's own Triton batch-invariant norm (one program per row, a fixed block), written into the
same tensors the fused kernel writes into. The sum is rounded to the model's dtype before the norm, as the fused
kernel does; the normalised values may differ from the fused kernel's in the last bit, which is the point: they no
longer depend on the batch. Needed and sufficient, on the model, by the same benchmark: vLLM's mode alone 8 of 60
calls bitwise, with this 60 of 60. It is engaged wherever the mode is on, not after a kernel-level probe: one that
normalised 128 seeded rows alone and among 512 at the model's width saw no difference on that H100, where the
model's own rows differed, so such a probe cannot say the replacement is not needed.
"""

from __future__ import annotations

import contextlib
import importlib
import os

#: The variable vLLM's workers read to switch their batch-invariant kernels on.
MODE_ENV = "VLLM_BATCH_INVARIANT"
#: Where vLLM's RMSNorm looks the batch-invariant norm up (a module global) and its name.
LAYERNORM_MODULE = "vllm.model_executor.layers.layernorm"
NORM = "rms_norm_batch_invariant"


def invariant_residual_norm(inner):
    """`inner` (vLLM's batch-invariant norm) with its residual case done as add, then `inner` without a residual."""

    def norm(input, weight, eps=1e-6, residual=None):
        if residual is None:
            return inner(input, weight, eps)
        residual.add_(input)
        input.copy_(inner(residual, weight, eps))
        return input, residual

    norm.__dict__.update(_harness_invariant=True, _harness_inner=inner)
    return norm


def engage(worker=None) -> dict:
    """(Runs on a worker.) With vLLM's batch-invariant mode on there, `invariant_residual_norm` where vLLM's RMSNorm
    looks its batch-invariant norm up (once). Says what it did (`engaged`: the replacement is in place)."""
    import vllm.envs as envs

    if not envs.VLLM_BATCH_INVARIANT:
        return {"engaged": False, "why": "vLLM's batch-invariant mode is not on in this worker"}
    try:
        module = importlib.import_module(LAYERNORM_MODULE)
    except Exception as exc:  # noqa: BLE001 - a build whose layernorm does not import has nothing to engage
        why = f"{LAYERNORM_MODULE} does not import: {type(exc).__name__}: {exc}"
        return {"engaged": False, "why": why}
    current = getattr(module, NORM, None)
    if current is None:
        return {"engaged": False, "why": f"{LAYERNORM_MODULE} has no {NORM}"}
    if not getattr(current, "_harness_invariant", False):
        setattr(module, NORM, invariant_residual_norm(current))
    return {"engaged": True, "where": f"{LAYERNORM_MODULE}.{NORM}"}


@contextlib.contextmanager
def mode_env(enabled: bool):
    """vLLM's batch-invariant switch in the environment while an engine starts (its workers read it there), where
    `enabled`; the environment as it was afterwards."""
    if not enabled:
        yield
        return
    before = os.environ.get(MODE_ENV)
    os.environ[MODE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MODE_ENV, None)
        else:
            os.environ[MODE_ENV] = before


def engage_all(executor) -> list[dict]:
    """`engage` in every worker of a started engine (vLLM's executor); what each found. Raises where one could not:
    its states would still depend on the batch."""
    found = executor.collective_rpc("_harness_call", args=(engage,))
    failing = [f for f in found if not f.get("engaged")]
    if failing:
        raise RuntimeError(f"batch_invariant: a worker's states would still depend on the batch: {failing[0]}")
    return found
