"""The processes a run starts (vLLM's engine cores and workers): listing this process's live children,
killing what is left, and the ones session-scoped generators own (not a test's leak)."""

from __future__ import annotations

#: Children every Python process may have that no test starts.
IGNORED_CHILDREN = ("multiprocessing.resource_tracker", "resource_tracker")


def children() -> dict[int, str]:
    """This process's live descendants (zombies and the resource tracker left out): pid -> command line."""
    import psutil

    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and not any(i in cmd for i in IGNORED_CHILDREN):
                out[p.pid] = cmd[:120]
        except psutil.Error:
            continue
    return out


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
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


#: Processes of session-scoped generators, which outlive single tests by design (closed at session end).
SESSION_PROCESSES: set[int] = set()


def adopt_session_processes() -> None:
    """Call right after starting a session-scoped generator: its workers are not a leak of the test."""
    SESSION_PROCESSES.update(children())
