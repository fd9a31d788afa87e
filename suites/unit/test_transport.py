"""The hand-off of captured states from worker to caller (harness.runtime.transport): platform-independent logic,
on the CPU; the same code's CUDA side (page-locked buffers) runs in the GPU tier's soak scenario."""

from __future__ import annotations

import os

import pytest
import torch

from harness.runtime import transport
from harness.runtime.pinning import Pins
from harness.support import shm_orphans


def test_shared_memory_hand_off_reuses_its_mapping_and_never_reads_a_lost_buffer(tmp_path):
    """The worker reuses one buffer; the caller maps it once (the file is then unlinked) and keeps the mapping
    until that worker's executor shuts down; a reply naming a buffer that is gone is an error, never zeros
    (an earlier cache that evicted mappings read a fresh empty file: wrong states, seen in CI)."""
    pub = transport.Publisher(str(tmp_path))
    first = pub.publish([torch.arange(6, dtype=torch.float32).reshape(2, 3)])
    assert torch.equal(transport.materialize(first)[0], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert not os.path.exists(first.path)  # unlinked once mapped
    second = pub.publish([torch.full((2, 3), 7.0)])
    assert second.path == first.path and torch.equal(transport.materialize(second)[0], torch.full((2, 3), 7.0))
    transport.forget([os.getpid()])
    with pytest.raises(transport.HandOffLost):
        transport.materialize(pub.publish([torch.zeros(2, 3)]))


def test_copy_threads_leave_a_core_per_worker_and_stay_bounded(monkeypatch):
    """The caller's copy threads: cores less one per busy-polling worker and one spare, 1 to MAX_COPY_THREADS."""
    for cores, workers, want in ((2, 1, 1), (16, 1, 8), (16, 8, 7), (128, 8, 8), (4, 4, 1)):
        monkeypatch.setattr(transport.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert transport.copy_threads(workers) == want, (cores, workers)
    assert transport.CopyOut(enabled=False).threads is None  # the benchmark's "before": vLLM's setting


def test_streamed_hand_off_places_rows_and_falls_back_whole(tmp_path):
    """Each step's rows go to their final place (moves out of capture order included); the batch's hand-off is
    the same bytes as the end-of-batch one; a step that cannot be placed, or a batch with rows missing, hands
    nothing over this way (the worker then falls back to the end-of-batch hand-off)."""
    layers = 2
    rows = torch.arange(10 * 4, dtype=torch.float32).reshape(10, 4)
    # request a: rows 0-5 (6 tokens), b: rows 6-9 (4 tokens); step 1 captures b[0:2] then a[0:4];
    # step 2 captures a[4:6] then b[2:4].
    steps = [([rows[6:8], rows[0:4]], [(0, 6, 2), (2, 0, 4)]), ([rows[4:6], rows[8:10]], [(0, 4, 2), (2, 8, 2)])]
    stream = transport.Stream(transport.Publisher(str(tmp_path)))
    for parts, moves in steps:
        captured = torch.cat(parts)
        stream.step([captured * (k + 1) for k in range(layers)], (10, moves))
    got = transport.materialize(stream.take())
    assert [torch.equal(g, rows * (k + 1)) for k, g in enumerate(got)] == [True] * layers
    assert stream.streamed == 1 and transport._coalesce([(0, 4, 2), (2, 6, 3), (9, 0, 1)]) == [(0, 4, 5), (9, 0, 1)]
    stream.step([rows[:4]], (10, [(0, 0, 4)]))
    assert stream.take() is None, "rows missing: no streamed hand-off"
    stream.step([rows[:4]], None)
    stream.step([rows[4:]], (10, [(0, 4, 6)]))
    assert stream.take() is None and stream.streamed == 1, "a step not placed spoils the batch's stream"


class StrictPins(Pins):
    """Keeps CUDA's rule for page-locked host memory: registering a range that overlaps one still registered
    fails (cudaErrorHostMemoryAlreadyRegistered), unregistering what is not registered fails too."""

    def __init__(self):
        self.live: dict[int, int] = {}
        self.registered = 0

    def register(self, address: int, nbytes: int) -> None:
        for a, n in self.live.items():
            if a < address + nbytes and address < a + n:
                raise RuntimeError(f"already registered: [{a}, {a + n}) overlaps [{address}, {address + nbytes})")
        self.live[address] = nbytes
        self.registered += 1

    def unregister(self, address: int) -> None:
        if self.live.pop(address, None) is None:
            raise RuntimeError(f"{address} is not registered")


def test_buffer_growth_unpins_the_old_buffer_before_it_is_dropped(tmp_path):
    """Batches that grow, shrink and grow again (the sequence that killed the worker on the H200 at its fourth
    call): every buffer is unpinned before it goes, at most one is pinned at a time, a smaller batch reuses
    the buffer, and each call's states arrive whole."""
    pins = StrictPins()
    pub = transport.Publisher(str(tmp_path), pins=pins)
    sizes = [4 * 64, 16 * 1500, 4 * 64, 32 * 2000, 8, 32 * 2000 + 1]
    for i, rows in enumerate(sizes):
        states = [torch.full((rows, 16), float(i)), torch.full((rows, 16), -float(i))]
        got = transport.materialize(pub.publish(states))
        assert [torch.equal(g, h) for g, h in zip(got, states, strict=True)] == [True, True], i
        assert len(pins.live) == 1 and next(iter(pins.live.values())) == int(pub.buf.numel())
    assert pub.grown == pins.registered == 4, "a smaller batch must reuse the buffer, a larger one grow it once"
    pub.close()
    assert pins.live == {} and os.listdir(tmp_path) == []
    transport.forget([os.getpid()])


def test_streamed_batches_that_grow_reuse_and_regrow_the_same_buffer(tmp_path):
    """The streamed hand-off allocates through the same publisher: a batch larger than any before grows it
    (old one unpinned), a smaller one reuses it."""
    pins = StrictPins()
    stream = transport.Stream(transport.Publisher(str(tmp_path), pins=pins))
    for i, rows in enumerate([8, 64, 8, 256, 16]):
        x = torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4) + i
        stream.step([x], (rows, [(0, 0, rows)]))
        assert torch.equal(transport.materialize(stream.take())[0], x), i
    assert stream.publisher.grown == 3 and len(pins.live) == 1
    stream.publisher.close()
    assert pins.live == {}
    transport.forget([os.getpid()])


def test_files_left_by_stopped_workers_are_discarded(tmp_path):
    """A worker killed before we mapped its buffer leaves the file: the executor's shutdown removes the files of
    its workers' pids, and only those."""
    for name in ("harness-states-123-a", "harness-states-123-b", "harness-states-1234-c", "other"):
        (tmp_path / name).write_bytes(b"x")
    assert sorted(shm_orphans.discard_files([123], str(tmp_path))) == ["harness-states-123-a", "harness-states-123-b"]
    assert sorted(os.listdir(tmp_path)) == ["harness-states-1234-c", "other"]


def test_openmp_registrations_of_ended_processes_are_removed_and_a_live_ones_kept(tmp_path):
    """Intel OpenMP names each process's registration file by pid (and uid) and unlinks it in a library destructor:
    a SIGKILLed process, or one ended by os._exit, leaves it in /dev/shm (vLLM 0.18's env preloads libiomp5)."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead.kill()
    dead.wait()
    live = os.getpid()
    reg = shm_orphans.OPENMP_REGISTRATION
    for name in (f"{reg}{dead.pid}_0", f"{reg}{live}_0", f"{reg}{live}", "harness-states-1-a"):
        (tmp_path / name).write_bytes(b"0x1-cafe-libomp.so")
    assert shm_orphans.openmp_registration_pid(f"{reg}{dead.pid}_0") == dead.pid
    assert shm_orphans.openmp_registration_pid("psm_0a1b") is None
    assert shm_orphans.discard_files([live], str(tmp_path)) == []  # the executor's workers: only exited ones
    assert shm_orphans.discard_openmp_registrations(directory=str(tmp_path)) == [f"{reg}{dead.pid}_0"]
    assert sorted(os.listdir(tmp_path)) == sorted([f"{reg}{live}_0", f"{reg}{live}", "harness-states-1-a"])


def test_after_an_engine_shuts_down_only_unmapped_new_queues_are_removed(tmp_path):
    """A dead engine core's queue is mapped by no one; one still mapped (a live generator's) and one that was
    there before stay."""
    import mmap

    (tmp_path / "psm_before").write_bytes(b"\0" * 4096)
    before = shm_orphans.entries(str(tmp_path))
    for name in ("psm_dead", "psm_live", "other"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    with open(tmp_path / "psm_live", "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert shm_orphans.discard_unmapped_since(before, str(tmp_path)) == ["psm_dead"]
    assert sorted(os.listdir(tmp_path)) == ["other", "psm_before", "psm_live"]
