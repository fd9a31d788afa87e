"""What dead workers leave in /dev/shm, removed: the harness's hand-off buffers of killed workers, the reply
queues (psm_*) of workers killed by a signal or of an engine that died, GiBs or ~10 MiB each that would stay until
reboot, and the Intel OpenMP runtime's registration files of processes that ended without unregistering."""

from __future__ import annotations

import contextlib
import os

SHM = "/dev/shm"  # memory, not disk: the hand-off buffers live here (harness.runtime.transport)


#: Intel OpenMP (libiomp5, which vLLM 0.18's CPU env preloads into every process) registers each process as a file
#: named by this prefix, its pid and its uid, and unlinks it in a library destructor: a process killed by a signal,
#: or ended by os._exit as multiprocessing's children are, leaves it behind.
OPENMP_REGISTRATION = "__KMP_REGISTERED_LIB_"


def openmp_registration_pid(name: str) -> int | None:
    """The pid an OpenMP registration file is named after (None for any other name)."""
    if not name.startswith(OPENMP_REGISTRATION):
        return None
    head = name[len(OPENMP_REGISTRATION) :].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def discard_openmp_registrations(pids=None, directory: str = SHM) -> list[str]:
    """Unlink the OpenMP registration files of these processes (of any, where None) that have exited; a live
    process's own registration is never touched."""
    ended = [
        n
        for n in sorted(entries(directory))
        if (pid := openmp_registration_pid(n)) is not None and (pids is None or pid in pids) and not _alive(pid)
    ]
    return _unlink(ended, directory)


def _unlink(names, directory: str) -> list[str]:
    """Unlink these names in `directory`; returns the ones that were there."""
    gone = []
    for name in names:
        try:
            os.unlink(os.path.join(directory, name))
            gone.append(name)
        except OSError:
            pass
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited: only its exit status is left
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def discard_files(pids, directory: str = SHM) -> list[str]:
    """Unlink the buffers these (stopped) worker processes left in `directory`: a worker killed mid-batch, or
    one whose last buffer the caller never mapped, leaves its file behind (GiBs at real shapes), and the OpenMP
    registration of a killed one. Returns them."""
    prefixes = tuple(f"harness-states-{pid}-" for pid in pids)
    buffers = [n for n in sorted(entries(directory)) if prefixes and n.startswith(prefixes)]
    return discard_openmp_registrations(set(pids), directory) + _unlink(buffers, directory)


def discard_segments(names, directory: str = SHM) -> list[str]:
    """Unlink these multiprocessing shared-memory segments of exited processes where they are still there (a
    process killed by a signal never unlinks what it made), and take them off the resource tracker that the
    workers share with this process, which would otherwise warn about them at exit. Returns the ones removed."""
    from multiprocessing import resource_tracker

    gone = _unlink(names, directory)
    for name in gone:
        with contextlib.suppress(Exception):  # no tracker running: nothing to tell
            resource_tracker.unregister("/" + name, "shared_memory")
    return gone


def mapped_shm(directory: str = SHM) -> set[str]:
    """Names in `directory` that some live process maps: a segment in use is not a leak."""
    names = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(directory + "/")
                    if i >= 0:
                        names.add(line[i + len(directory) + 1 :].split()[0])
        except OSError:
            continue
    return names


def entries(directory: str = SHM) -> set[str]:
    """The names in `directory` now (none where it cannot be read)."""
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


def discard_unmapped_since(before: set[str], directory: str = SHM) -> list[str]:
    """After an engine was shut down: unlink the queues (psm_*) made since `before` that no live process maps.
    An engine whose core died leaves one that nobody unlinks (seen on vLLM 0.30: the native export's engine dies
    at its first extraction on a CPU build, and one segment stayed after every process had exited). A segment
    still mapped belongs to a live process (the session's own generators, another job) and stays."""
    made = {n for n in entries(directory) - before if n.startswith("psm_")}
    return discard_segments(sorted(made - mapped_shm(directory)), directory)
