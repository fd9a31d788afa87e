"""The root cause of a failed native run, read from the engine's and its workers' output (they are other
processes: the caller only gets a wrapper that says "see above")."""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

from harness.contracts.base import summarize
from harness.support import fdio

#: Terminal colour codes: vLLM's servers colour their log prefixes ("(APIServer pid=N)") where they think a terminal is.
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:(?:ERROR|WARNING|INFO|DEBUG)\s+\S+\s+\S+\s+\[[^\]]*\]\s?)?")
_EXC_LINE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit))(?::\s*(.*))?$")
_FILE_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
#: Exceptions that only say "see above": the root cause is the first exception line that is not one of them.
_WRAPPERS = (
    "Engine core initialization failed",
    "Worker failed with error",
    "EngineCore encountered",
    "EngineDeadError",
    "See root cause above",
    "see stack trace",
)


#: Failures of the platform, not of the layers asked for: retrying with other layer ids cannot change them.
_PLATFORM_FAILURE = re.compile(r"spec decode is not supported|CUDA|cuda|NVIDIA driver")


def platform_failure(error) -> bool:
    """Whether the native path failed for a reason of this platform (e.g. a CUDA-only stream on a CPU build)."""
    return bool(_PLATFORM_FAILURE.search(error.root_cause or str(error)))


def root_cause(log: str) -> str | None:
    """The first real exception in vLLM's engine/worker output, with where it was raised.

    The engine and its workers are separate processes: what reaches the caller is a wrapper ("Engine
    core initialization failed. See root cause above."). The cause is in their log, as a traceback
    whose last line names the exception; that line (and the frame above it) is what the report needs.
    """
    from harness.contracts.base import short_path

    where = None
    for raw in log.splitlines():
        line = _LOG_PREFIX.sub("", ANSI.sub("", raw).rstrip())
        frame = _FILE_LINE.match(line)
        if frame:
            where = f"{short_path(frame.group(1))}:{frame.group(2)} in {frame.group(3)}"
            continue
        m = _EXC_LINE.match(line.strip())
        if not m or any(w in line for w in _WRAPPERS):
            continue
        text = f"{m.group(1)}: {m.group(2) or ''}".rstrip(": ")
        return summarize(text + (f" @ {where}" if where else ""), 400)
    return None


@contextmanager
def engine_output_to(log_path: Path):
    """Send this process's fds 1 and 2 to `log_path` while vLLM starts its engine and workers: the children
    inherit them, so their tracebacks (vLLM logs them to stdout) land in the file for `root_cause` to read."""
    with open(log_path, "ab", buffering=0) as fh, fdio.fds_to(fh):
        yield
