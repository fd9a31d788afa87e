"""The worker extension the harness gives vLLM: speculators' own, with the worker-side shims.

vLLM mixes `ParallelConfig.worker_extension_cls` into each worker. Ours subclasses speculators'
`HiddenStatesWorkerExtension`; around speculators' `_setup_hidden_states_capture` (run with the names the
`Attach.WORKER_GLOBALS` shims replace) it applies the `Attach.WORKER` shims before and the
`Attach.WORKER_AFTER` shims after, and the states and reset shims where speculators fetches and resets the
capture. Which shims engage is decided here, on the real loaded model, by looking at it; a disabled set
sent by the driver turns shims off for proofs.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from harness import contracts
from harness.contracts.base import Attach

for _, _shim in contracts.selected(Attach.IMPORT):  # in the worker process: before speculators is imported here
    _shim.fn()

from speculators.data_generation.custom_worker import HiddenStatesWorkerExtension  # noqa: E402

from harness.contracts.base import Attempt  # noqa: E402
from harness.runtime import transport  # noqa: E402
from harness.support.namespace import rebind  # noqa: E402

_SPECULATORS_MODULE_GLOBALS = vars(sys.modules[HiddenStatesWorkerExtension.__module__])


#: Worker methods that run a forward (the warm-up's dummy run, the memory profile, speculators' steps).
FORWARD_METHODS = ("compile_or_warm_up_model", "determine_available_memory", "execute_model")


def run_forward_in_config_context(worker) -> None:
    """Run this worker's forward-running methods inside `set_current_vllm_config(worker.vllm_config)`.

    Not a speculators contract: vLLM's own engine calls the same RPCs. vLLM wraps worker construction,
    device and KV-cache initialisation in its config context, but not every forward, so a layer that builds
    a CustomOp during the forward fails with "Current vLLM config is not set". The CPU fused-MoE fallback
    (taken where `torch.ops._C.prepack_moe_weight` is absent, e.g. on an AVX2-only EPYC) builds `SiluAndMul`
    per call: on 0.14 already in the warm-up run (plain vLLM fails the same way there, see
    harness.reporting.attribution), on 0.20 and 0.22 in every MoE step. The context only makes the config readable;
    it changes no numbers. Set on the instance, once, before the executor's warm-up (`_harness_configure`).
    """
    if worker.__dict__.get("_harness_config_context"):
        return
    from vllm.config import set_current_vllm_config

    def in_context(inner):
        def call(*args, **kwargs):
            with set_current_vllm_config(worker.vllm_config):
                return inner(*args, **kwargs)

        return call

    for name in FORWARD_METHODS:
        if callable(getattr(worker, name, None)):
            setattr(worker, name, in_context(getattr(worker, name)))
    worker._harness_config_context = True


def setup_capture(worker, layer_ids, disabled: frozenset) -> dict:
    """speculators' capture set-up with the worker shims not in `disabled`; returns which ones engaged."""
    run_forward_in_config_context(worker)
    engaged = {}
    for cid, shim in contracts.selected(Attach.WORKER, disabled):
        engaged[cid] = shim.fn(worker)
    ns: dict = {}
    for cid, shim in contracts.selected(Attach.WORKER_GLOBALS, disabled):
        engaged[cid] = shim.fn(ns, lambda name: ns.get(name, _SPECULATORS_MODULE_GLOBALS[name]), worker)
    spec_cls: Any = rebind(HiddenStatesWorkerExtension, ns) if ns else HiddenStatesWorkerExtension
    spec_cls._setup_hidden_states_capture(worker, layer_ids)
    for cid, shim in contracts.selected(Attach.WORKER_AFTER, disabled):
        engaged[cid] = shim.fn(worker)
    stream_each_step(worker)
    worker._harness_engaged = {cid: bool(v) for cid, v in engaged.items() if v is not None}
    return worker._harness_engaged


def stream_each_step(worker) -> None:
    """After every `execute_model`, hand the forward's captured rows to the worker's stream, and before it queue
    the previous forward's copies (outermost wrapper, once per worker). Not a contract: how the states travel,
    see harness.runtime.transport.Stream."""
    if worker.__dict__.get("_harness_streaming"):
        return
    inner = worker.execute_model

    def execute_model(scheduler_output, *args, **kwargs):
        if worker._harness_stream is not None:  # the previous step's copies, behind vLLM's own for that step
            worker._harness_stream.flush()
        captured = getattr(worker, "_captured_states", None)
        before = len(captured[0]) if captured else 0
        out = inner(scheduler_output, *args, **kwargs)
        worker._harness_stream_step(scheduler_output, before)
        return out

    worker.execute_model = execute_model
    worker._harness_streaming = True


def placement(worker, scheduler_output, rows: int):
    """Where this forward's rows go, from the one selected `Attach.WORKER_ROWS` shim; None where none is selected,
    or where a selected `Attach.WORKER_STATES` shim would change the states without saying where rows go."""
    disabled = worker._harness_disabled
    rows_shims = contracts.selected(Attach.WORKER_ROWS, disabled)
    placed_by = {cid for cid, _ in rows_shims}
    if len(rows_shims) != 1 or any(
        cid not in placed_by for cid, _ in contracts.selected(Attach.WORKER_STATES, disabled)
    ):
        return None
    return rows_shims[0][1].fn(worker, scheduler_output, rows)


def setup_attempts(worker, layer_ids, contract_id: str) -> dict:
    """speculators' set-up without `contract_id`'s shim, then with the worker's configured shims."""
    unshimmed, _ = Attempt.run(lambda: setup_capture(worker, layer_ids, frozenset({contract_id})))
    shimmed, _ = Attempt.run(lambda: setup_capture(worker, layer_ids, worker._harness_disabled))
    return {"unshimmed": unshimmed, "shimmed": shimmed}


class HarnessWorkerExtension(HiddenStatesWorkerExtension):
    _harness_disabled: frozenset = frozenset()
    _harness_engaged: dict = {}
    _harness_hang: tuple | None = None

    def _harness_configure(self, disabled) -> None:
        """Called by the driver right after the executor starts, before speculators' KV-cache set-up."""
        self._harness_disabled = frozenset(disabled)
        run_forward_in_config_context(self)

    def _setup_hidden_states_capture(self, layer_ids: list[int]):
        setup_capture(self, layer_ids, self._harness_disabled)

    def _harness_setup_attempts(self, layer_ids, contract_id: str) -> dict:
        """For worker-side probes: speculators' set-up without one shim, then with the configured ones."""
        return setup_attempts(self, layer_ids, contract_id)

    def _harness_engaged_shims(self) -> dict:
        return dict(self._harness_engaged)

    _harness_captures: int = 0

    def _harness_call(self, fn, *args):
        """Run `fn(worker, *args)` on this worker itself. A function sent as the RPC method is called with vLLM's
        worker wrapper, which forwards reads to the worker but keeps attributes set on it for itself."""
        return fn(self, *args)

    #: "stream" (default: each step's rows leave during the next step), "shm" (all rows after the last step,
    #: through shared memory), "rpc" (the tensors in the reply, as speculators ships) or "device" (streamed into a
    #: buffer on this worker's GPU, handed to the caller through CUDA IPC: harness.runtime.device_hand_off).
    _harness_transport: str = "stream"
    _harness_publisher = None
    _harness_stream = None
    _harness_device_stream = None

    def _harness_hand_off(self) -> transport.Stream:
        """The stream into the current mode's buffer: host shared memory, or this worker's GPU for "device"."""
        if self._harness_transport == "device":
            if self._harness_device_stream is None:
                from harness.runtime.device_hand_off import DevicePublisher

                self._harness_device_stream = transport.Stream(DevicePublisher())
            return self._harness_device_stream
        if self._harness_stream is None:
            self._harness_publisher = transport.Publisher()
            self._harness_stream = transport.Stream(self._harness_publisher)
        return self._harness_stream

    def _harness_streams(self) -> list:
        return [s for s in (self._harness_stream, self._harness_device_stream) if s is not None]

    def _harness_stream_step(self, scheduler_output, before: int) -> None:
        """After a forward: its captured rows to the stream (see stream_each_step)."""
        captured = getattr(self, "_captured_states", None)
        if self._harness_transport not in transport.STREAMED or not captured:
            return
        stream = self._harness_hand_off()
        if len(captured[0]) != before + 1:  # a forward that did not capture exactly once: not placeable
            stream.failed = True
            return
        states = [layer[-1] for layer in captured]
        stream.step(states, placement(self, scheduler_output, int(states[0].shape[0])))

    def _get_captured_states(self):
        """speculators' states, handed over through shared memory where there is room (harness.runtime.transport),
        or on this worker's GPU in mode "device": streamed during the steps where every row was placed, else after
        the last step."""
        self._maybe_hang("_get_captured_states")
        if self._harness_transport in transport.STREAMED:
            handle = self._harness_hand_off().take()
            if handle is not None:
                self._captured_states = None  # as speculators does once it has concatenated them
                return handle
        states = super()._get_captured_states()
        for _, shim in contracts.selected(Attach.WORKER_STATES, self._harness_disabled):
            states = shim.fn(self, states)
        if not states or self._harness_transport not in ("stream", "shm", "device"):  # the tensors in the RPC reply
            return states
        return self._harness_hand_off().publisher.publish(states) or states

    def _harness_set_transport(self, mode: str) -> dict:
        """Choose the hand-off (transport.MODES); returns how many batches went through shared memory so far, how
        many of those were streamed, and how many were left on the device."""
        if mode not in transport.MODES:
            raise ValueError(f"unknown transport {mode!r}")
        previous, self._harness_transport = self._harness_transport, mode
        if mode == "device":
            try:
                self._harness_hand_off()  # a worker without CUDA refuses here, not at the first batch
            except ValueError:
                self._harness_transport = previous
                raise
        for stream in self._harness_streams():
            stream.begin()
        device = self._harness_device_stream
        return {
            "shm": self._harness_publisher.published if self._harness_publisher else 0,
            "streamed": self._harness_stream.streamed if self._harness_stream else 0,
            "device": device.publisher.published if device else 0,
        }

    def _store_captured_states(self, aux_hidden_states):
        # Counted per rank: speculators captures on TP rank 0 only, and the GPU tier checks that.
        self._harness_captures += 1
        return super()._store_captured_states(aux_hidden_states)

    def _harness_capture_count(self) -> int:
        return self._harness_captures

    def _harness_peak_memory(self) -> int | None:
        """Peak bytes allocated by torch on this worker's device (None off CUDA)."""
        import torch

        return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None

    def _harness_device_memory(self) -> tuple[int, int] | None:
        """Bytes held by live tensors and bytes torch's caching allocator reserves on this worker's device now
        (None off CUDA): the soak scenario reads both after every call."""
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())

    def _harness_hang_next(self, method: str, seconds: float) -> None:
        """Test hook: make the next call of `method` on this worker sleep (a hung worker, on demand)."""
        self._harness_hang = (method, seconds)

    def _maybe_hang(self, method: str) -> None:
        if self._harness_hang and self._harness_hang[0] == method:
            seconds = self._harness_hang[1]
            self._harness_hang = None
            time.sleep(seconds)

    def _reset_capture(self):
        self._maybe_hang("_reset_capture")
        for _, shim in contracts.selected(Attach.WORKER_RESET, self._harness_disabled):
            shim.fn(self)
        for stream in self._harness_streams():
            stream.begin()
        return super()._reset_capture()
