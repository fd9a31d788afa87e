"""What dead workers leave in /dev/shm, removed: the harness's hand-off buffers of killed workers and the reply
queues (psm_*) of workers killed by a signal, GiBs or ~10 MiB each that would stay until reboot."""

from __future__ import annotations

import os

from harness.runtime.transport import SHM


def discard_files(pids, directory: str = SHM) -> list[str]:
    """Unlink the buffers these (stopped) worker processes left in `directory`: a worker killed mid-batch, or
    one whose last buffer the caller never mapped, leaves its file behind (GiBs at real shapes). Returns them."""
    gone = []
    for pid in pids:
        prefix = f"harness-states-{pid}-"
        try:
            names = [n for n in os.listdir(directory) if n.startswith(prefix)]
        except OSError:
            return gone
        for name in names:
            try:
                os.unlink(os.path.join(directory, name))
                gone.append(name)
            except FileNotFoundError:
                pass
    return gone


def discard_segments(names, directory: str = SHM) -> list[str]:
    """Unlink these multiprocessing shared-memory segments of exited processes where they are still there (a
    process killed by a signal never unlinks what it made), and take them off the resource tracker that the
    workers share with this process, which would otherwise warn about them at exit. Returns the ones removed."""
    from multiprocessing import resource_tracker

    gone = []
    for name in names:
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            continue
        gone.append(name)
        try:
            resource_tracker.unregister("/" + name, "shared_memory")
        except Exception:  # no tracker running: nothing to tell
            pass
    return gone
