"""How the captured hidden states travel from the worker to the caller: a shared-memory file, not the RPC.

speculators fetches them with `collective_rpc("_get_captured_states")`, and vLLM's executor message queue
pickles every byte of the reply. Measured on one H200 (vLLM 0.20, a 1.4B bf16 Llama, 32 x 256 tokens,
4 layers, 128 MiB; `benchmarks/gpu_extraction_profile.py`): that RPC took 486 ms of a 551 ms call while the
forward with the capture took 38 ms -- extraction ran at 9% of plain prefill.

Instead the worker copies the tensors into a buffer in /dev/shm (memory, not disk) and replies with its
name and layout (`SharedStates`, a few hundred bytes); the caller views the same bytes as tensors
(`materialize`, called by the executor view on that RPC's reply), and speculators copies its rows out as it
always does. The buffer is kept and reused by both sides (fresh pages cost a fault each: a new 128 MiB file
per call took 103 ms, most of it faulting), grown when a call needs more, and pinned for the device copy
where CUDA allows; the caller unlinks the file as soon as it has mapped it, so nothing outlives the two
processes. The bytes are the ones the RPC would have carried: results are bit-identical (a test compares
both ways). Where /dev/shm lacks room (containers often give it 64 MiB) the reply carries the tensors.
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from harness.runtime.pinning import CudaPins, Pins
from harness.support.shm_orphans import SHM

ALIGN = 64
METHOD = "_get_captured_states"
#: The worker's hand-offs: step by step into shared memory (default), after the last step into shared memory,
#: or the tensors in the RPC reply (speculators as shipped).
MODES = ("stream", "shm", "rpc", "device")
#: The modes whose rows leave step by step (host shared memory, or the worker's own GPU: harness.runtime.device_hand_off).
STREAMED = ("stream", "device")


class HandOff:
    """A `_get_captured_states` reply that names where the tensors are instead of carrying them."""

    def receive(self) -> list:
        raise NotImplementedError


#: Per hand-off kind, what drops the caller's mappings of shut-down workers (see `forget`).
_FORGETTERS: list = []


@dataclass(frozen=True)
class SharedStates(HandOff):
    """A reply that names a shared-memory file holding tensors: (dtype, shape, offset, nbytes) each."""

    path: str
    nbytes: int
    layout: tuple

    def receive(self) -> list:
        return receive(self)


def _dtype(name: str):
    import torch

    return getattr(torch, name.replace("torch.", ""))


def _pack(entries) -> tuple[list, int]:
    """Layout of tensors placed one after another, each aligned: (dtype name, shape, offset, nbytes) per
    (dtype, shape, nbytes) entry, and the bytes they take."""
    layout, offset = [], 0
    for dtype, shape, n in entries:
        layout.append((str(dtype), tuple(shape), offset, n))
        offset += -(-n // ALIGN) * ALIGN
    return layout, max(offset, ALIGN)


def _views(buf, layout) -> list:
    """The tensors a layout names, as views of the byte buffer."""
    return [buf[off : off + n].view(_dtype(dtype)).view(shape) for dtype, shape, off, n in layout]


class Publisher:
    """Worker side: one reusable shared-memory buffer, grown on demand.

    On CUDA the buffer is page-locked (`cudaHostRegister`) and must be unregistered before it is dropped: the
    mapping goes away with the last view, the registration does not, and the next mapping may reuse those
    addresses. Not unregistering it crashed the worker the second time a batch outgrew the buffer on the H200
    (`cudaErrorHostMemoryAlreadyRegistered`, raised by whichever CUDA call came next). `pins` is who registers:
    CUDA's runtime where it is available, none elsewhere (a unit test passes one that keeps CUDA's rules).
    """

    def __init__(self, directory: str = SHM, pins: Pins | None = None):
        self.directory = directory
        self.path: str | None = None
        self.buf: Any = None  # uint8 tensor over the mapped file
        self.published = 0
        self.grown = 0  # buffers made (the first included)
        self.pins = pins if pins is not None else CudaPins.if_available()
        self._pinned: tuple[int, int] | None = None  # (address, bytes) registered for self.buf

    def _buffer(self, total: int):
        import torch

        if self.buf is not None and self.buf.numel() >= total:
            return self.buf
        if not os.path.isdir(self.directory) or shutil.disk_usage(self.directory).free < total + (64 << 20):
            return None
        self.close()
        self.path = os.path.join(self.directory, f"harness-states-{os.getpid()}-{uuid.uuid4().hex}")
        storage = torch.UntypedStorage.from_file(self.path, shared=True, nbytes=total)
        self.buf = torch.empty(0, dtype=torch.uint8).set_(storage)
        self.grown += 1
        if self.pins is not None:  # page-locked: the device copies straight into it
            self._pinned = (self.buf.data_ptr(), total)
            self.pins.register(*self._pinned)
        return self.buf

    def publish(self, states: list) -> HandOff | None:
        layout, total = _pack((h.dtype, h.shape, h.numel() * h.element_size()) for h in states)
        buf = self._buffer(total)
        if buf is None:
            return None
        for h, view in zip(states, _views(buf, layout), strict=True):
            view.copy_(h)
        if states and states[0].is_cuda:
            import torch

            torch.cuda.synchronize()
        return self.handle(layout)

    def handle(self, layout: list) -> HandOff:
        assert self.path is not None, "handle() after _buffer() made the buffer"
        self.published += 1
        return SharedStates(self.path, int(self.buf.numel()), tuple(layout))

    def close(self) -> None:
        """Drop the buffer (the caller may still map it; the memory goes with the last mapping), unpinned first."""
        if self._pinned is not None and self.pins is not None:
            self.pins.unregister(self._pinned[0])
            self._pinned = None
        if self.path and os.path.exists(self.path):
            os.unlink(self.path)
        self.path, self.buf = None, None


class Stream:
    """Worker side: each forward's captured rows leave the device while the next step runs.

    With one hand-off at the end, the worker waits after the last step for the whole batch to cross to the
    host (at Kimi-K2.5's width, 5.6 GiB a call: 0.12 s on the H200 after a 1.9 s forward). Here every step's
    rows are copied, on a side CUDA stream, straight to their final place in the publisher's buffer: per
    layer, one [total rows, hidden] block, rows where the contract that orders them says (`Attach.WORKER_ROWS`,
    which also gives the batch's total). The bytes and their places are those of the end-of-batch hand-off (a
    test compares both ways bit for bit). Where a step cannot be placed, or the buffer cannot be had, the batch
    falls back to the end-of-batch hand-off. Off CUDA the copies are synchronous (same result, no overlap).

    A step's copies are queued when the next step starts (`flush`, called before each `execute_model`), not
    when its forward ends: queued at once, they went to the device-to-host copy engine ahead of vLLM's own
    small copy of that step's sampled tokens, which the host waits for before it schedules the next step, so
    every step waited for ~0.4 GiB to cross first. Traced on the H200 at the Kimi width (vLLM 0.20,
    `benchmarks/gpu_extraction_profile.py --gpu-profile`): kernel time was the same either way, but the compute
    stream sat idle 192 ms a call between steps against 91 ms with the end-of-batch hand-off; the forward
    took 1960 ms against 1881 ms. After the last step only that step's copies are waited for (`take`).
    """

    def __init__(self, publisher: Publisher):
        self.publisher = publisher
        self.side: Any = None  # the CUDA stream the copies run on
        self.streamed = 0  # batches handed over this way
        self.begin()

    def begin(self) -> None:
        """A new batch: nothing placed yet (copies of an earlier batch still queued are waited for: their source
        tensors are about to be dropped)."""
        if self.side is not None:
            self.side.synchronize()
        self.pending: tuple | None = None  # the last forward's (states, moves, ready event), queued at the next flush
        self.views: list | None = None
        self.layout: list = []
        self.total = self.placed = 0
        self.failed = False

    def step(self, states: list, placement) -> None:
        """One forward's captured tensors (one per layer) and where their rows go: (total, moves) or None."""
        if self.failed or not states:
            return
        if placement is None or (self.views is not None and placement[0] != self.total):
            self.failed = True
            return
        if self.views is None and not self._allocate(placement[0], states):
            self.failed = True
            return
        views = self.views
        if (
            views is None
            or len(states) != len(views)
            or any(h.dtype != v.dtype or h.shape[1:] != v.shape[1:] for h, v in zip(states, views, strict=True))
        ):
            self.failed = True
            return
        moves = _coalesce(placement[1])
        if states[0].is_cuda:
            import torch

            self.flush()
            self.pending = (states, moves, torch.cuda.current_stream().record_event())
        else:
            for h, view in zip(states, views, strict=True):
                for src, dst, n in moves:
                    view[dst : dst + n].copy_(h[src : src + n])
        self.placed += sum(n for _, _, n in moves)

    def _allocate(self, total: int, states: list) -> bool:
        layout, size = _pack((h.dtype, (total, *h.shape[1:]), total * h[:1].numel() * h.element_size()) for h in states)
        buf = self.publisher._buffer(size)
        if buf is None:
            return False
        self.total, self.layout, self.views = total, layout, _views(buf, layout)
        return True

    def flush(self) -> None:
        """Queue the last forward's copies on the side stream (they start once that forward's states are ready)."""
        if self.pending is None:
            return
        import torch

        states, moves, ready = self.pending
        self.pending = None
        assert self.views is not None, "a step is pending only once its batch's buffer is allocated"
        if self.side is None:
            self.side = torch.cuda.Stream()
        with torch.cuda.stream(self.side):
            self.side.wait_event(ready)
            for h, view in zip(states, self.views, strict=True):
                h.record_stream(self.side)
                for src, dst, n in moves:
                    view[dst : dst + n].copy_(h[src : src + n], non_blocking=True)

    def take(self) -> HandOff | None:
        """The batch's hand-off once every row of it is in place (after the last copy ends); else None."""
        complete = not self.failed and self.views is not None and self.placed == self.total
        if complete:
            self.flush()
        if self.side is not None:  # also when incomplete: the fallback then writes the same buffer
            self.side.synchronize()
        handle = self.publisher.handle(self.layout) if complete else None
        self.streamed += bool(complete)
        self.begin()
        return handle


def _coalesce(moves: list) -> list:
    """Adjacent moves whose source and destination rows both continue each other, as one."""
    out: list = []
    for src, dst, n in moves:
        if out and out[-1][0] + out[-1][2] == src and out[-1][1] + out[-1][2] == dst:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + n)
        else:
            out.append((src, dst, n))
    return out


#: Caller side: per worker process (its pid is in the file name), the file it publishes into and our mapping of
#: it. The file is unlinked once mapped, so a mapping is kept for as long as that worker reuses its buffer and
#: dropped when the worker moves to a bigger one or its executor shuts down (`forget`).
_MAPPED: dict[int, tuple[str, Any]] = {}


class HandOffLost(RuntimeError):
    """A shared-memory reply names a buffer that is neither mapped here nor on disk any more."""


def _pid(path: str) -> int:
    return int(os.path.basename(path).split("-")[2])


def receive(handle: SharedStates) -> list:
    """Caller side: map the worker's buffer (once; later replies reuse the mapping), view the tensors in it."""
    import torch

    pid = _pid(handle.path)
    path, buf = _MAPPED.get(pid, (None, None))
    if path != handle.path or buf is None or buf.numel() < handle.nbytes:
        if not os.path.exists(handle.path):  # from_file would create an empty file: never read zeros as states
            raise HandOffLost(f"{handle.path} is neither mapped by this process nor on disk")
        storage = torch.UntypedStorage.from_file(handle.path, shared=True, nbytes=handle.nbytes)
        os.unlink(handle.path)
        buf = torch.empty(0, dtype=torch.uint8).set_(storage)
        _MAPPED[pid] = (handle.path, buf)
    return _views(buf, handle.layout)


def forget(pids) -> None:
    """Drop the mappings of these worker processes (their executor is shut down), of every hand-off kind."""
    pids = list(pids)
    for pid in pids:
        _MAPPED.pop(pid, None)
    for drop in _FORGETTERS:
        drop(pids)


def materialize(reply):
    """A `_get_captured_states` reply as speculators expects it: tensors, whichever way they came."""
    if isinstance(reply, HandOff):
        return reply.receive()
    if isinstance(reply, list) and any(isinstance(r, HandOff) for r in reply):
        return [r.receive() if isinstance(r, HandOff) else r for r in reply]
    return reply


#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit


def reuse_host_memory() -> bool:
    """Let this process reuse the host memory of states it has dropped, instead of faulting in fresh pages.

    speculators copies every prompt's rows out of the hand-off buffer (`.clone()`, one tensor per prompt and
    layer: 1-20 MiB each at real shapes). glibc serves each such block with a fresh mmap and unmaps it when
    freed, so every call's copies fault in and zero all their pages again. With mmap reserved for blocks over
    32 MiB and the heap never trimmed, a batch's copies land in memory freed by an earlier batch. Nothing
    computed changes; the process keeps its peak host memory. glibc only: returns whether it applied.
    """
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, -1))


#: More copy threads than this gained nothing on the H200 (see CopyOut).
MAX_COPY_THREADS = 8


def copy_threads(workers: int) -> int:
    """torch threads for the caller's copies: the cores this process may use, less one per worker (vLLM's
    workers busy-poll a core each while they wait) and one to spare, at most MAX_COPY_THREADS, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_COPY_THREADS, cores - workers - 1))


class CopyOut:
    """How the caller copies each prompt's rows out of the hand-off buffer (speculators' `.clone()` per prompt
    and layer, in the caller's process), used around every `generate`: into reused host memory
    (`reuse_host_memory`), not fresh pages, on `copy_threads(workers)` torch threads instead of the one
    vLLM's multiproc executor leaves the caller on CUDA. Nothing computed changes: the same bytes are copied.

    Measured on one H200 (vLLM 0.20, `benchmarks/gpu_extraction_profile.py`): host-memory reuse took the
    1.4B shape's time after the forward from 89 ms to 33 ms (forward 42 ms). At the Llama-3-8B shape (64
    prompts of 1-2k tokens, 0.8 GB a call) the copies took 559 ms on 1 thread, 343 ms on 2, 187 ms on 4 and
    179 ms on 8 (extraction 0.79x, 0.85x, 0.90x, 0.90x plain prefill). All 16 cores were much slower (1.0 s
    instead of 0.2 s for the 1.4B shape's 128 copies): a thread that shares its core with a busy-polling
    worker holds up every copy. `enabled=False` gives the unoptimised copy (the benchmark's "before").
    """

    def __init__(self, enabled: bool = True, threads: int | None = None, workers: int = 1):
        self.enabled = enabled
        self.reusing = False
        #: torch's intra-op threads for the copies (None: copy_threads(workers); unused when not enabled)
        self.threads = (threads or copy_threads(workers)) if enabled else None

    @contextmanager
    def __call__(self):
        if self.enabled and not self.reusing:
            self.reusing = reuse_host_memory()
        if not self.threads:
            yield
            return
        import torch

        before = torch.get_num_threads()
        if self.threads <= before:  # never fewer threads than the caller already has
            yield
            return
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)
