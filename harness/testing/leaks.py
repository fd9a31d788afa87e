"""No process a test started outlives it (session-scoped generators excepted)."""

from __future__ import annotations

import time

import pytest

from harness.processes import SESSION_PROCESSES, children, reap


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
