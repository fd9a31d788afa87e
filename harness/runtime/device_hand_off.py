"""The captured states left on the GPU: for a consumer that trains on the device the target model runs on.

The host hand-off (harness.runtime.transport) copies every captured byte from the worker's GPU into pinned shared
memory; a trainer on the same GPU then copies it back. With `Options(states_on="device")` (the worker's transport
mode "device") the same rows go, step by step as the streamed hand-off places them, into a buffer on the worker's
own GPU instead, and the caller gets tensors on that device (the fast path hands them out as they are; speculators'
own loop copies each prompt's rows to the host itself): the buffer is shared with the caller's process once
through CUDA IPC (torch's reduction of a CUDA tensor, with its reference counting: the memory stays valid while the
caller holds a view, even after the worker moves to a bigger buffer), and each reply names only its layout.

The bytes and their places are those of the host hand-off; the results are bitwise equal (the GPU tier and
`benchmarks/gpu_batch_shapes.py` compare them). The buffer is reused by the next call as the host one is (the fast
path's `Views` move held results out first), and it lives outside the share of GPU memory given to vLLM: a call's
states (e.g. 0.5 GB at 16 x 2048 tokens x 4 layers x 2048 wide in bf16) must fit beside the engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from harness.runtime import transport
from harness.runtime.transport import _views


@dataclass(frozen=True)
class DeviceStates(transport.HandOff):
    """A reply naming tensors in a worker's device buffer: (dtype, shape, offset, nbytes) each. `ipc` is torch's
    CUDA IPC reduction of the buffer, sent with every reply but opened once per buffer (`serial`)."""

    pid: int
    serial: int
    nbytes: int
    layout: tuple
    ipc: tuple

    def receive(self) -> list:
        return receive(self)


class DevicePublisher(transport.Publisher):
    """Worker side: one reusable uint8 buffer on this worker's GPU, grown on demand; a `Publisher` whose buffer is
    on the device and whose reply is a `DeviceStates` (`transport.Stream` writes into it as into the host one).
    `grown` numbers the buffers: a reply's `serial`, by which the caller knows to open a new one."""

    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("the device hand-off needs the worker on a CUDA device; this worker has none")
        super().__init__()
        self.pins = None  # device memory: nothing to page-lock
        self._ipc: tuple | None = None

    def _buffer(self, total: int):
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        if self.buf is not None and self.buf.numel() >= total:
            return self.buf
        self.close()
        self.buf = torch.empty(total, dtype=torch.uint8, device=torch.cuda.current_device())
        self.grown += 1
        self._ipc = reduce_tensor(self.buf)[1]  # (rebuild_cuda_tensor's arguments): the caller opens it once
        return self.buf

    def handle(self, layout: list) -> DeviceStates:
        assert self._ipc is not None, "handle() after _buffer() made the buffer"
        self.published += 1
        return DeviceStates(os.getpid(), self.grown, int(self.buf.numel()), tuple(layout), self._ipc)

    def close(self) -> None:
        """Drop the buffer; torch keeps its memory while the caller still holds it (CUDA IPC reference count)."""
        self.buf, self._ipc = None, None


#: Caller side: per worker process, the buffer serial opened and its tensor here.
_OPENED: dict[int, tuple[int, object]] = {}


def receive(handle: DeviceStates) -> list:
    """Caller side: open the worker's device buffer (once per buffer), view the tensors in it."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    serial, buf = _OPENED.get(handle.pid, (None, None))
    if serial != handle.serial:
        buf = rebuild_cuda_tensor(*handle.ipc)
        _OPENED[handle.pid] = (handle.serial, buf)
    return _views(buf, handle.layout)


def forget(pids) -> None:
    """Drop what this process opened of these worker processes (their executor is shut down)."""
    for pid in pids:
        _OPENED.pop(pid, None)


transport._FORGETTERS.append(forget)
