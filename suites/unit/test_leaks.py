"""The shared-memory leak check (harness.testing.leaks): what it counts as left behind."""

from __future__ import annotations

import mmap
import os

from harness.testing import leaks


def test_an_unmapped_new_entry_is_left_a_mapped_one_or_a_tracked_semaphore_is_not(monkeypatch, tmp_path):
    monkeypatch.setattr(leaks, "SHM", str(tmp_path))
    (tmp_path / "old").write_bytes(b"x")
    before = leaks.shm_entries()
    for name in ("psm_leaked", "in-use", leaks.TRACKED_AT_EXIT + "abc"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    with open(tmp_path / "in-use", "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert leaks.shm_left(before, wait_s=0) == {"psm_leaked"}
    os.unlink(tmp_path / "psm_leaked")
    assert leaks.shm_left(before, wait_s=0) == {"in-use"}, "once unmapped, a new entry is left behind"
