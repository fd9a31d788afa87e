"""Output at the file-descriptor level (fds 1 and 2): what C code, library import-time warnings and spawned
child processes write, which Python's own stream redirection does not catch."""

from __future__ import annotations

import contextlib
import os
import sys
from contextlib import contextmanager


@contextmanager
def fds_to(fh, fds: tuple[int, ...] = (1, 2)):
    """Send this process's `fds` to the open file `fh` for the duration; restored afterwards, always.

    Child processes started meanwhile inherit the redirection for as long as they live (vLLM's workers log
    their tracebacks there)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream must not stop the run
            stream.flush()
    saved = {fd: os.dup(fd) for fd in fds}
    try:
        for fd in saved:
            os.dup2(fh.fileno(), fd)
        yield fh
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # as above
                stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def replay(fh, fd: int = 2) -> None:
    """Write what `fh` holds to `fd` (output held back while deciding whether it matters)."""
    fh.flush()
    fh.seek(0)
    data = fh.read()
    if data:
        os.write(fd, data if isinstance(data, bytes) else data.encode())
