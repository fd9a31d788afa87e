"""Which shared generators close to make room for another, measured on real processes' resident memory."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from harness.testing import room


@pytest.fixture
def live():
    """Three 'generators' whose one worker each is a real process holding ~64, ~128 and ~32 MiB."""
    procs = [
        subprocess.Popen([sys.executable, "-c", f"b = bytearray({mib} << 20); import time; time.sleep(60)"])
        for mib in (64, 128, 32)
    ]
    import time

    time.sleep(1.5)
    yield [
        (name, SimpleNamespace(real_executor=SimpleNamespace(workers=[SimpleNamespace(proc=p)])))
        for name, p in zip(("a", "b", "c"), procs, strict=True)
    ]
    for p in procs:
        p.kill()
        p.wait()


def test_nothing_closes_while_the_largest_worker_fits(live):
    assert room.to_close(live, available=64 << 30) == []
    assert room.to_close([]) == []


def test_the_most_recently_used_close_first_until_two_of_the_largest_fit(live):
    sizes = {n: room.worker_bytes(g) for n, g in live}
    assert sizes["b"] > 128 << 20 > sizes["a"] > 64 << 20 > sizes["c"] > 32 << 20, sizes
    need = 2 * sizes["b"] + room.MARGIN_BYTES
    assert room.to_close(live, available=need - 1) == ["c"]  # c's memory back is enough
    assert room.to_close(live, available=need - sizes["c"] - 1) == ["c", "b"]
    assert room.to_close(live, available=0) == ["c", "b", "a"]


def test_memory_is_read_from_the_kernel():
    assert 0 < room.available_bytes() < 1 << 50
