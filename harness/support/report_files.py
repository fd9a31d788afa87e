"""How every report file is written: whole or not at all, readable by everyone who can read its folder, and
stamped with the time in UTC. Every package that writes a report (the suites' runs, the gate, the benchmarks,
the client checks) uses these, so a reader never meets half a file."""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename, so readers never see half a report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is for everyone who can read the folder
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
