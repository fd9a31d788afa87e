"""The devices a generator's start needs, checked before anything starts (one line where they cannot serve)."""

from __future__ import annotations

from harness.runtime import cpu_ranks
from harness.runtime.cpu_ranks import Ranks
from harness.runtime.inputs import HarnessInputError

#: Where the results' hidden states may be handed out (Options.states_on).
STATES_ON = ("host", "device")


def checked(tensor_parallel_size: int, states_on: str = "host", batch_invariant: bool = False) -> Ranks | None:
    """What the devices must give before a start: GPUs enough for N ranks on CUDA, a CUDA build for the options that
    need one; on a CPU build, N ranks' binding, swap and memory (harness.runtime.cpu_ranks). HarnessInputError (one
    line) where they cannot."""
    if tensor_parallel_size < 1:
        raise HarnessInputError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    if states_on not in STATES_ON:
        raise HarnessInputError(f"states_on must be one of {', '.join(STATES_ON)}, got {states_on!r}")
    from vllm.platforms import current_platform

    if batch_invariant and current_platform.device_type != "cuda":
        raise HarnessInputError(
            f"batch_invariant needs vLLM on CUDA (its batch-invariant kernels are Triton on the GPU); "
            f"this vLLM runs on {current_platform.device_type}"
        )
    if states_on == "device" and current_platform.device_type != "cuda":
        raise HarnessInputError(
            f"states_on='device' needs vLLM on CUDA; this vLLM runs on {current_platform.device_type}"
        )
    if current_platform.device_type == "cuda":
        import torch

        have = torch.cuda.device_count()
        if have < tensor_parallel_size:
            raise HarnessInputError(
                f"tensor_parallel_size={tensor_parallel_size} needs {tensor_parallel_size} GPUs; "
                f"this machine has {have}"
            )
    try:
        return cpu_ranks.for_this_machine(tensor_parallel_size)
    except cpu_ranks.CannotHold as exc:
        raise HarnessInputError(str(exc)) from None
