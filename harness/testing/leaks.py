"""Nothing a run started outlives it: no process a test started (session-scoped generators excepted), no file
in /dev/shm that the session made and no live process still maps."""

from __future__ import annotations

import os
import time

import pytest

from harness.processes import SESSION_PROCESSES, children, reap
from harness.runtime.transport import SHM


@pytest.fixture(autouse=True)
def no_leftover_workers():
    """Fails a test that leaves a process it started alive (session-scoped generators excepted)."""
    before = set(children()) | SESSION_PROCESSES
    yield
    deadline = time.monotonic() + 15  # a shut-down executor's workers take a moment to exit
    left = {}
    while time.monotonic() < deadline:
        left = {pid: cmd for pid, cmd in children().items() if pid not in before and pid not in SESSION_PROCESSES}
        if not left:
            return
        time.sleep(0.5)
    reap(left)
    pytest.fail(f"processes started by this test are still alive after it: {left}")


def shm_entries() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def mapped_shm(directory: str = SHM) -> set[str]:
    """Names in `directory` that some live process maps (a segment in use is not a leak)."""
    names = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(directory + "/")
                    if i >= 0:
                        names.add(line[i + len(directory) + 1:].split()[0])
        except OSError:
            continue
    return names


#: multiprocessing's named semaphores: unlinked by their creator's resource tracker when the creator exits, which
#: for this process is after the session (seen: one left at session end, none once the process had exited). A
#: child killed together with its tracker leaks them; the tests that kill children let the tracker live instead.
TRACKED_AT_EXIT = "sem.mp-"


def shm_left(before: set[str], wait_s: float = 10.0) -> set[str]:
    """Entries of /dev/shm made since `before` that no live process maps and no resource tracker will remove
    (waiting up to `wait_s` for owners that are still shutting down to unlink theirs)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = {n for n in (shm_entries() - before) - mapped_shm(SHM) if not n.startswith(TRACKED_AT_EXIT)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


@pytest.fixture(scope="session", autouse=True)
def no_leftover_shared_memory():
    """Fails the session (at its last teardown) when it leaves files in /dev/shm: vLLM's message-queue segments of
    a killed child are 240 MiB each, a killed worker's hand-off buffer GiBs at real shapes. What is left is
    removed, then reported."""
    before = shm_entries()
    yield
    deadline = time.monotonic() + 20  # closed executors' workers unlink their own segments as they exit
    while children() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = shm_left(before)
    for name in left:
        try:
            os.unlink(os.path.join(SHM, name))
        except OSError:
            pass
    if left:
        pytest.fail(f"the session left files in {SHM} (removed now): {sorted(left)}")
