"""vLLM's hidden-states connector with its CUDA copy stream replaced by synchronous host copies, for CPU builds.

speculators >= 0.5 extracts through `vllm serve` with vLLM's `ExampleHiddenStatesConnector`. From 0.22 that
connector copies each finished request's hidden states device -> host on a CUDA side stream into pinned memory,
and a thread pool writes the file once a CUDA event says the copy is done. A CPU build has no CUDA, so the first
request kills the engine: 0.22 cannot open the stream, 0.25 calls `wait_event` on the CPU stream placeholder
(which has none), 0.28+ asks for pinned memory ("Found no NVIDIA driver").

On a CPU build the KV cache the connector reads is host memory: a plain copy is already complete when it
returns, and a completion event is trivially done. `SyncWriteHiddenStatesConnector` is the upstream connector,
unchanged, with `torch.cuda`'s stream, event and pinning in *its module* replaced by those synchronous
equivalents: the same slots of the same cache are read, the same safetensors file is written by the same thread
pool under the same lock protocol. What is computed does not change; only the waiting, which has nothing to wait
for on a host, goes. vLLM loads it through kv_transfer_config's `kv_connector_module_path`.

Chosen by probing (`needed()`: does a CUDA stream's `wait_event` or a pinned buffer work in this process?), never
by version; proven needed (the upstream connector's documented failures, `FAILURES`) and sufficient (speculators
0.9.0's client then agrees with our extraction) by suites/clients/test_client.py.
"""

from __future__ import annotations

import contextlib

import torch

#: What the upstream connector's CUDA-only writer raised on the CPU builds, in the engine's log: 0.22 (opening the
#: copy stream), 0.25 (wait_event on the CPU placeholder), 0.28-0.32 (the pinned host buffer).
FAILURES = (
    r"CUDA driver version is insufficient for CUDA runtime version"
    r"|'_StreamPlaceholder' object has no attribute 'wait_event'"
    r"|Found no NVIDIA driver on your system"
)
NAME = "SyncWriteHiddenStatesConnector"
MODULE = __name__


def needed() -> str | None:
    """Why the upstream writer cannot run in this process (its first CUDA call, made here), or None. Where CUDA
    is available nothing is called (the probe must not create a CUDA context in the caller)."""
    if torch.cuda.is_available():
        return None
    try:
        stream = torch.cuda.Stream()
        event = torch.cuda.Event()
        event.record()
        stream.wait_event(event)
        torch.empty(1, pin_memory=True)
    except Exception as e:  # noqa: BLE001 - whichever call fails first is the answer
        return f"{type(e).__name__}: {e}"
    return None


class _DoneEvent:
    """A completion event for a copy that completed when it returned."""

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True


class _HostStream:
    """The copy stream of a host: work issued on it has finished when the call returns."""

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _HostCuda:
    """`torch.cuda` as the connector's module sees it here: streams, events, stream contexts for a host."""

    Stream = _HostStream
    Event = _DoneEvent

    @staticmethod
    def stream(stream=None):
        return contextlib.nullcontext()

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


class _TorchOnHost:
    """`torch` for the connector's module: the real one, but host streams and no page pinning (pinning needs a
    CUDA driver; it only speeds up a device copy, which a host does not make)."""

    cuda = _HostCuda()

    @staticmethod
    def empty_like(*args, pin_memory: bool = False, **kwargs):
        return torch.empty_like(*args, **kwargs)

    @staticmethod
    def empty(*args, pin_memory: bool = False, **kwargs):
        return torch.empty(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(torch, name)


def _connector_class():
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as upstream

    if needed():
        upstream.torch = _TorchOnHost()  # this module's names only; every other module keeps the real torch

    class SyncWriteHiddenStatesConnector(upstream.ExampleHiddenStatesConnector):
        """ExampleHiddenStatesConnector, writing after synchronous host copies (see the module docstring)."""

    return SyncWriteHiddenStatesConnector


def __getattr__(name):
    # vLLM imports this module in the engine's worker and asks it for NAME: built then, in that process.
    if name == NAME:
        cls = _connector_class()
        globals()[NAME] = cls
        return cls
    raise AttributeError(name)
