"""Child runs that a test only checks, started in the background as soon as the session knows it needs them.

On the 2-core CI machine a conformance run mostly keeps one core busy: an engine start-up is one spawned
worker importing vLLM while the test process waits for it. A few tests do nothing but start a child (a whole
`harness run` they interrupt or hand a bad configuration, interpreters that build vLLM's message queue) and
check what it did. Their children run here, one at a time on a background thread, from the moment collection
ends, beside the tests before them; the test then waits for its job's result (at once, if it is done) and
asserts on it as before. Only jobs of selected tests start (`@pytest.mark.ahead("name")` on the test, the job
registered with `@job("name")`); a test whose job has not started runs it itself.

A job is two parts. The function registered runs in the thread that starts the job (pytest's main thread): all
in-process work belongs there (imports, building a tiny model, reading a wheel, writing inputs). It returns the
part that runs on the background thread, which only starts child processes and waits for them. The split is
the point: libraries with lazy module attributes are not safe to import from two threads at once (seen:
`ImportError: cannot import name 'AutoConfig' from 'transformers'` in a job while the main thread imported
transformers too, 2 fresh-clone runs in 3), and two threads building the same cached model would race as well.

The jobs' processes carry `harness.support.processes.JOB_MARK` = this process's pid in their environment (their own
children inherit it), so the leak check leaves them to their job, not to whichever test happens to be running
(`harness.support.processes.children`). At session end, what is still running is killed and waited for: no process
outlives the session, pass or fail.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_JOBS: dict[str, Callable[[], Any]] = {}
_FUTURES: dict[str, Future] = {}
_POOL: ThreadPoolExecutor | None = None


def job(name: str):
    """Register `fn()` as the background job `name`: `fn()` runs in the starting thread and returns a callable
    (child processes only) whose result is what the test asserts on."""

    def register(fn):
        _JOBS[name] = fn
        return fn

    return register


def env(base: dict | None = None) -> dict:
    """The environment for a job's child process (`base`, else this one's), marked as the job's."""
    from harness.support.processes import JOB_MARK

    return {**(os.environ if base is None else base), JOB_MARK: str(os.getpid())}


def _submit(name: str) -> Future:
    global _POOL
    if name not in _FUTURES:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-ahead")
        try:
            waits = _JOBS[name]()  # the in-process part, in this thread
        except Exception as exc:  # noqa: BLE001 - the test that asks for the job raises it
            failed: Future = Future()
            failed.set_exception(exc)
            _FUTURES[name] = failed
        else:
            if not callable(waits):
                raise TypeError(f"background job {name!r} must return the callable its thread runs, got {waits!r}")
            _FUTURES[name] = _POOL.submit(waits)
    return _FUTURES[name]


def result(name: str) -> Any:
    """The job's result (raising what it raised), waiting for it; started now if it was not yet."""
    if name not in _JOBS:
        raise KeyError(f"no background job {name!r} is registered")
    return _submit(name).result()


def pytest_collection_finish(session):
    """Start the jobs of the selected tests, in the order the tests run (`HARNESS_AHEAD=0`: each when its test
    runs, as before there were jobs; for timing the difference)."""
    if hasattr(session.config, "workerinput") or os.environ.get("HARNESS_AHEAD") == "0":
        return  # an xdist worker collects every test but runs a share: its jobs start when their tests run
    for item in session.items:
        for mark in item.iter_markers("ahead"):
            if mark.args and mark.args[0] in _JOBS:
                _submit(mark.args[0])


def pytest_configure(config):
    config.addinivalue_line("markers", "ahead(name): the test checks background job `name` (harness.testing.ahead)")


def pytest_sessionfinish(session, exitstatus):
    stop()


def stop() -> None:
    """Kill what the jobs still run, then drop the jobs not begun and wait for the thread."""
    global _POOL
    if _POOL is None:
        return
    from harness.support.processes import owned_by_jobs, reap

    for fut in _FUTURES.values():
        fut.cancel()
    reap(owned_by_jobs())
    _POOL.shutdown(wait=True, cancel_futures=True)
    reap(owned_by_jobs())  # started by a job after the first sweep
    _POOL = None
    _FUTURES.clear()
