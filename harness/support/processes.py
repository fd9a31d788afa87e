"""The processes a run starts (vLLM's engine cores and workers): listing this process's live children,
killing what is left, and the ones session-scoped generators own (not a test's leak)."""

from __future__ import annotations

import contextlib
import os

#: Children every Python process may have that no test starts.
IGNORED_CHILDREN = ("multiprocessing.resource_tracker", "resource_tracker")
#: Environment variable naming the test process whose background job (harness.testing.ahead) a process belongs to;
#: inherited by that process's own children.
JOB_MARK = "HARNESS_AHEAD_OF"


def children() -> dict[int, str]:
    """This process's live descendants (zombies, the resource tracker and the processes of background jobs,
    `harness.testing.ahead`, left out): pid -> command line."""
    return {p.pid: cmd for p, cmd in _descendants() if not _owned(p)}


def owned_by_jobs() -> list[int]:
    """The live descendants that belong to this process's background jobs (`harness.testing.ahead`)."""
    return [p.pid for p, _ in _descendants() if _owned(p)]


def _descendants() -> list:
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and not any(i in cmd for i in IGNORED_CHILDREN):
                out.append((p, cmd[:120]))
        except psutil.Error:
            continue
    return out


def _owned(p) -> bool:
    import psutil

    try:
        return p.environ().get(JOB_MARK) == str(os.getpid())
    except psutil.Error:
        return False


def reap(pids) -> None:
    """Kill these processes and wait (up to 10 s) until they are gone."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)
    from harness.support.shm_orphans import discard_openmp_registrations

    discard_openmp_registrations([p.pid for p in procs])  # a killed process cannot unregister itself


#: Processes of session-scoped generators, which outlive single tests by design (closed at session end).
SESSION_PROCESSES: set[int] = set()


def adopt_session_processes() -> None:
    """Call right after starting a session-scoped generator: its workers are not a leak of the test."""
    SESSION_PROCESSES.update(children())
