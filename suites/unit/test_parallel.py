"""harness.support.parallel: how many pytest-xdist workers a run gets (a number, or auto from cores and memory)."""

from __future__ import annotations

import pytest

from harness.support import parallel


def test_a_number_is_taken_and_nonsense_refused():
    if not parallel.xdist_installed():
        assert parallel.jobs("3") == 1  # no xdist: one process, whatever was asked
        return
    assert parallel.jobs("3") == 3 and parallel.pytest_args(3) == ["-n", "3", "--dist", "loadgroup"]
    with pytest.raises(ValueError, match="--jobs must be >= 1 or auto"):
        parallel.jobs("0")
    with pytest.raises(ValueError):
        parallel.jobs("two")


def test_auto_is_bounded_by_cores_and_memory(monkeypatch):
    monkeypatch.setattr(parallel, "xdist_installed", lambda: True)
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(parallel, "available_gib", lambda: 64.0)
    assert parallel.jobs("auto") == 1  # two workers on two cores were slower than one process (measured)
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 16)
    assert parallel.jobs("auto") == parallel.MAX_WORKERS
    monkeypatch.setattr(parallel, "available_gib", lambda: 10.0)
    assert parallel.jobs("auto") == 1
    assert parallel.pytest_args(1) == []
