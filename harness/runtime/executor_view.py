"""The executor as speculators sees it: the real `MultiprocExecutor`, behind a thin view.

speculators calls `collective_rpc(..., unique_reply_rank=0)[0]` and `execute_model()` on its
executor. vLLM calls the same methods on itself internally, so shims on them cannot be overrides on
the executor class (vLLM's own `execute_model` relies on the single-reply `collective_rpc`). The
view applies the selected shims attached to speculators' calls (`Attach.RPC_REPLY`, `Attach.STEP`,
`Attach.BATCH_START`); everything else is forwarded to the real executor untouched.

The view also carries the harness's lifecycle guarantees: every RPC gets a timeout (a hung worker
becomes a clear `WorkerTimeout`, not a hang), and `shutdown()` is idempotent.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any

from harness import contracts
from harness.contracts.base import Attach
from harness.contracts.rpc import echo
from harness.runtime import transport
from harness.support import shm_orphans

#: The RPC speculators sends once a batch's requests are added, before its first step.
RESET = "_reset_capture"


class WorkerTimeout(RuntimeError):
    """A worker did not answer an RPC in time; the executor has been shut down."""


class WorkerDied(RuntimeError):
    """A worker process exited under the generator; it is shut down and every later call says the same
    until a new generator is built (vLLM itself answers later calls with an unrelated assertion)."""


def worker_procs(real: Any) -> list[tuple[Any, Any]]:
    """(handle, process) for each worker process of the real executor that has one."""
    handles = getattr(real, "workers", None) or []
    return [(h, h.proc) for h in handles if getattr(h, "proc", None) is not None]


#: How long a worker may take to leave its busy loop once told to stop, before it is sent SIGTERM.
STOP_GRACE_S = 0.3


def stop_workers_promptly(real: Any, grace_s: float = STOP_GRACE_S) -> int:
    """vLLM's own shutdown steps, with a shorter first wait: close each worker's death pipe (its signal to leave
    the busy loop), wait up to `grace_s`, then SIGTERM the ones still running; returns how many were sent it.

    vLLM's `shutdown()` closes the pipes and then waits up to 4 s before SIGTERM. A worker leaves its loop at
    once but then takes ~1.5 s more to exit (its interpreter's teardown); with ~30 engines a run, that wait
    was ~45 s of the CPU suite (vLLM 0.16, 2 cores: `close()` 1.7-1.9 s -> 0.4 s; no /dev/shm entry left
    either way). `shutdown()` still follows and finds the workers gone or going (it sends SIGKILL after its own
    waits). Executors without death pipes are left to `shutdown()` alone.
    """
    import os
    import signal
    import time

    procs = []
    for handle, proc in worker_procs(real):
        writer = getattr(handle, "death_writer", None)
        if writer is None or not proc.is_alive():
            continue
        writer.close()
        handle.death_writer = None
        procs.append(proc)
    deadline = time.monotonic() + grace_s
    while procs and time.monotonic() < deadline and any(p.is_alive() for p in procs):
        time.sleep(0.02)
    termed = 0
    for proc in procs:
        if proc.is_alive():
            try:
                os.kill(proc.pid, signal.SIGTERM)
                termed += 1
            except ProcessLookupError:
                pass
    return termed


def dead_workers(real: Any) -> list[str]:
    """'worker <rank> (pid <pid>) died: killed by SIGKILL' for each worker process of `real` that exited."""
    import signal

    out = []
    for handle, proc in worker_procs(real):
        if proc.is_alive():
            continue
        code = proc.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        out.append(f"worker {getattr(handle, 'rank', '?')} (pid {proc.pid}) died: {how}")
    return out


def worker_segments(real: Any) -> list[str]:
    """The /dev/shm names of the message queues the worker processes created (each worker writes its replies
    into a queue it made). A worker that exits unlinks its own; one killed by a signal (by a user, the OOM killer,
    or vLLM's shutdown after its waits) cannot, and on vLLM >= 0.34 the executor's shutdown drops the last mapping
    of it, so ~10 MiB per worker would stay in /dev/shm until reboot."""
    names = []
    for handle, _ in worker_procs(real):
        mq = getattr(handle, "worker_response_mq", None)
        name = getattr(getattr(getattr(mq, "buffer", None), "shared_memory", None), "name", None)
        if isinstance(name, str):
            names.append(name)
    return names


def _parameters(method: Any) -> Any:
    """A callable's parameter names (read once per function: bound methods are new objects on every access)."""
    return _parameters_of(getattr(method, "__func__", method))


@functools.lru_cache(maxsize=64)
def _parameters_of(fn: Any) -> Any:
    return inspect.signature(fn).parameters


class PendingStep:
    """A step sent to the workers whose reply is not read yet (`ExecutorView.submit_step`)."""

    def __init__(self, view: ExecutorView, future: Any, done: Any = None):
        self.view, self.future, self.done = view, future, done

    def result(self) -> Any:
        """The step's output, after the step shims (as `ExecutorView.execute_model` returns it)."""
        if self.future is None:
            return self.view._after_step(self.done)
        return self.view._after_step(self.settle())

    def settle(self) -> Any:
        """Wait for the reply; a dead worker is named."""
        try:
            return self.future.result()
        except Exception as exc:
            self.view._raise_if_dead(exc)
            raise


class ExecutorView:
    def __init__(self, real: Any, state: Any, *, rpc_timeout_s: float):
        """`state`: the generator's ShimState (its `disabled` set chooses the shims; shims may read it)."""
        self.real = real
        self.state = state
        self.rpc_timeout_s = rpc_timeout_s
        disabled = state.disabled
        self._reply_shims = contracts.selected(Attach.RPC_REPLY, disabled)
        self._step_shims = contracts.selected(Attach.STEP, disabled)
        self._batch_start = contracts.selected(Attach.BATCH_START, disabled)
        #: how often each selected shim of this view changed something, by contract id
        self.engaged: dict[str, int] = {cid: 0 for cid, _ in self._reply_shims + self._step_shims}
        self.steps = 0  # execute_model() calls made by speculators (scheduler steps)
        self._lock = threading.Lock()
        self._closed = False
        self.died: str | None = None  # set once a worker is found dead; every later call raises WorkerDied
        self._behind: list[Any] | None = None  # inside steps_in_flight(): replies to calls sent behind a step
        self.sent_behind = 0  # follow-up calls sent behind a step without waiting, over the view's life
        self.follow_ups_behind = True  # False: steps_in_flight() waits for them too (a benchmark's comparison)
        # read now: vLLM's worker monitor shuts the executor down (dropping the queues) as soon as a worker dies
        self._segments = worker_segments(real)
        # Behavioural detection: ask rank 0 to echo a marker and look at what comes back.
        reply = self._rpc(echo, args=("marker",), unique_reply_rank=0)
        self.single_reply = reply == "marker"
        self.reply_shape = "single" if self.single_reply else type(reply).__name__

    # -- speculators' two executor calls, with the shims attached to them ------------------------
    def collective_rpc(
        self,
        method: Any,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
        **extra: Any,
    ) -> Any:
        out = self._rpc(
            method,
            timeout=timeout,
            args=args,
            kwargs=kwargs,
            non_block=non_block,
            unique_reply_rank=unique_reply_rank,
            **extra,
        )
        if method == transport.METHOD:  # the captured states may come as a shared-memory file
            out = transport.materialize(out)
        elif method == RESET:  # speculators added this batch's requests and is about to step
            for _, shim in self._batch_start:
                shim.fn(self, self.state)
        for cid, shim in self._reply_shims:
            shimmed = shim.fn(self, out, unique_reply_rank)
            if shimmed is not out:
                self.engaged[cid] += 1
                out = shimmed
        return out

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self._raise_if_dead()
        try:
            out = self.real.execute_model(scheduler_output, *args, **kwargs)
        except Exception as exc:
            self._raise_if_dead(exc)
            raise
        return self._after_step(out)

    def submit_step(self, scheduler_output: Any) -> PendingStep:
        """`execute_model` without waiting for the reply (vLLM's `non_block`): the fast path schedules the next step
        while the worker runs this one. `PendingStep.result()` waits and then applies the step shims, exactly as
        `execute_model` does; an executor without `non_block` runs the step at once."""
        self._raise_if_dead()
        if not self._non_block:
            return PendingStep(self, None, self.real.execute_model(scheduler_output))
        try:
            return PendingStep(self, self.real.execute_model(scheduler_output, non_block=True))
        except Exception as exc:
            self._raise_if_dead(exc)
            raise

    @property
    def _non_block(self) -> bool:
        """Whether the real executor's `execute_model` takes `non_block`."""
        return "non_block" in _parameters(self.real.execute_model)

    @contextlib.contextmanager
    def steps_in_flight(self):
        """The fast path's steps: a call a step shim sends right after a step (`send_behind`) is not waited for
        here, so the workers find the next step queued behind it instead of waiting for a round trip to the
        host. Its reply is read when the block ends, in the order sent, and a failure there raises."""
        self._behind = []
        try:
            yield
            for future in self._behind:
                PendingStep(self, future).settle()
        finally:
            self._behind = None

    def send_behind(self, method: Any, *args: Any) -> None:
        """A follow-up call a step shim makes after a step (C-twophase's `sample_tokens(None)`): waited for, as in
        speculators' loop, except inside `steps_in_flight()` where the executor takes `non_block`."""
        if self._behind is not None and self.follow_ups_behind and "non_block" in _parameters(method):
            self._behind.append(method(*args, non_block=True))
            self.sent_behind += 1
        else:
            method(*args)

    def _after_step(self, out: Any) -> Any:
        self.steps += 1
        for cid, shim in self._step_shims:
            if shim.fn(self, out):
                self.engaged[cid] += 1
        return out

    # -- lifecycle ------------------------------------------------------------------------------
    def _raise_if_dead(self, cause: BaseException | None = None) -> None:
        """After a failed call (or before any call once it happened): name the dead worker, shut down."""
        if self.died is None and cause is not None and not self._closed:
            dead = dead_workers(self.real)
            if dead:
                self.died = "; ".join(dead)
        if self.died is None:
            return
        self.shutdown()
        raise WorkerDied(f"{self.died}; the executor is shut down: build a new generator") from cause

    def _rpc(self, method: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        self._raise_if_dead()
        try:
            return self.real.collective_rpc(method, timeout=timeout or self.rpc_timeout_s, **kwargs)
        except TimeoutError as exc:
            self._raise_if_dead(exc)
            name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
            self.shutdown()
            raise WorkerTimeout(
                f"worker did not answer RPC {name!r} within {timeout or self.rpc_timeout_s:g} s; executor shut down"
            ) from exc
        except Exception as exc:
            self._raise_if_dead(exc)
            raise

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        pids = [proc.pid for _, proc in worker_procs(self.real)]
        transport.forget(pids)
        try:
            stop_workers_promptly(self.real)
        finally:
            try:
                self.real.shutdown()
            finally:
                shm_orphans.discard_files(pids)  # a worker killed mid-batch leaves its buffer unmapped by us
                shm_orphans.discard_segments(self._segments)  # and its reply queue (the workers have exited by now)

    @property
    def closed(self) -> bool:
        return self._closed

    def __getattr__(self, item: str) -> Any:
        return getattr(self.real, item)
