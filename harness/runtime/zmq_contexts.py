"""The zmq contexts vLLM leaves to the garbage collector, closed by the harness before they can hang it.

vLLM's `MultiprocExecutor` message queues (`shm_broadcast.MessageQueue`) create a zmq context each and never
close it or its sockets. When the context and its sockets become garbage together, the cyclic collector
clears the context's weak set of sockets first, so `Context.__del__` closes nothing and `zmq_ctx_term` waits
for sockets that are still open: forever, in whichever thread triggered the collection, with Python signal
handlers unable to run (a SIGTERM's KeyboardInterrupt raised there is even swallowed as "exception ignored
in __del__"). Seen on vLLM 0.20: after a shim proof whose workers failed to start, the next test hung in
`Context.__del__` until it was killed.

The harness therefore records the contexts created while it builds an executor (`track`) and destroys them,
sockets first with LINGER 0, once that executor is shut down or failed to start (`destroy`). `destroy_all`
does the same for every context left in the process, for the end of a session when no engine is running.
"""

from __future__ import annotations

import contextlib
import weakref


@contextlib.contextmanager
def track(into: weakref.WeakSet, monitors: list | None = None):
    """Record in `into` every zmq context created inside the block (by any thread of this process), and in
    `monitors` the worker-monitor threads started inside it (see `join`), also when the block fails."""
    import threading

    threads_before = set(threading.enumerate())
    try:
        import zmq
    except ImportError:  # no zmq, no vLLM executor: nothing to track
        yield into
        return
    real_init = zmq.Context.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        into.add(self)

    zmq.Context.__init__ = recording_init
    try:
        yield into
    finally:
        zmq.Context.__init__ = real_init
        if monitors is not None:
            monitors.extend(new_monitors(threads_before))


#: The thread vLLM's MultiprocExecutor starts to watch its workers; when one dies it shuts the executor down from
#: there, closing the message queues' sockets (vLLM 0.32's `_close_zmq`).
MONITOR_THREAD = "MultiprocWorkerMonitor"


def new_monitors(before: set) -> list:
    """The worker-monitor threads started since `before` (a `set(threading.enumerate())`): this executor's."""
    import threading

    return [t for t in threading.enumerate() if t.name == MONITOR_THREAD and t not in before]


def join(monitors, timeout_s: float = 20.0) -> None:
    """Wait for these monitor threads to finish (their executor is shut down, so their workers are gone and they
    return). Destroying the contexts while one of them is still closing its sockets aborts the process inside
    libzmq (seen on vLLM 0.32 after a worker was killed mid-generate: "Fatal Python error: Aborted" in
    `_close_zmq`, called from the monitor thread)."""
    import threading
    import time

    deadline = time.monotonic() + timeout_s
    for t in monitors:
        if t is not threading.current_thread():
            t.join(max(0.0, deadline - time.monotonic()))


def destroy(contexts) -> int:
    """Close every socket of these contexts (LINGER 0) and terminate them; returns how many were open.
    Call it only once the executor that used them is shut down: no thread may still poll their sockets."""
    n = 0
    for ctx in list(contexts):
        if not ctx.closed:
            ctx.destroy(linger=0)
            n += 1
    return n


def destroy_all() -> int:
    """`destroy` for every context in this process (a scan of the heap: seconds in a vLLM process; for the
    end of a session, when every engine is shut down)."""
    import gc

    try:
        import zmq
    except ImportError:
        return 0
    return destroy(obj for obj in gc.get_objects() if isinstance(obj, zmq.Context))
