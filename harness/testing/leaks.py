"""Nothing a run started outlives it: no process a test started (session-scoped generators excepted), no file
in /dev/shm that the session made and no live process still maps."""

from __future__ import annotations

import contextlib
import os
import time

import pytest

from harness.support.processes import SESSION_PROCESSES, children, reap
from harness.support.shm_orphans import SHM, discard_openmp_registrations, entries, mapped_shm, openmp_registration_pid


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
    return entries(SHM)


#: multiprocessing's named semaphores: unlinked by their creator's resource tracker when the creator exits, which
#: for this process is after the session (seen: one left at session end, none once the process had exited). A
#: child killed together with its tracker leaks them; the tests that kill children let the tracker live instead.
TRACKED_AT_EXIT = "sem.mp-"


def shm_left(before: set[str], wait_s: float = 10.0) -> set[str]:
    """Entries of /dev/shm made since `before` that no live process maps and no resource tracker will remove
    (waiting up to `wait_s` for owners that are still shutting down to unlink theirs)."""
    deadline = time.monotonic() + wait_s
    while True:
        discard_openmp_registrations(directory=SHM)  # of processes that have ended (see harness.support.shm_orphans)
        left = {
            n
            for n in (shm_entries() - before) - mapped_shm(SHM)
            if not n.startswith(TRACKED_AT_EXIT) and openmp_registration_pid(n) is None
        }  # live ones' own
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


#: Where each /dev/shm entry of the session first appeared (a test's id, or a phase): what the session's check names.
FIRST_SEEN: dict[str, str] = {}
_CURRENT: dict = {}  # the test being run: its id and what /dev/shm held when it began


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Notes which test (set-up, call and teardown) each new /dev/shm entry appeared in: two directory listings
    per test, so that a session that leaves one names where to look."""
    before = shm_entries()
    _CURRENT.update(nodeid=item.nodeid, before=before)
    yield
    for name in shm_entries() - before:
        FIRST_SEEN.setdefault(name, item.nodeid)


def first_seen(name: str) -> str:
    if name in FIRST_SEEN:
        return FIRST_SEEN[name]
    if _CURRENT and name not in _CURRENT["before"]:
        return f"during {_CURRENT['nodeid']} or the teardown after it"
    return "before the first test"


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
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM, name))
    if left:
        where = ", ".join(f"{n} ({first_seen(n)})" for n in sorted(left))
        pytest.fail(f"the session left files in {SHM} (removed now): {where}")
