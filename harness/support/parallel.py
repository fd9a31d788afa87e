"""How many pytest-xdist workers a conformance run gets (`harness run --jobs N|auto`, HARNESS_JOBS).

A CPU run spends most of its time starting engines (Python imports, model load, KV-cache allocation), one
core at a time, so workers overlap only where each has cores of its own: each worker holds its own shared
generators (`--dist loadgroup` keeps one tiny model's tests on one worker) and the engines its tests start.
Measured on the 2-core, 24 GiB machine (vllm016): one process 332 s of tests; `--jobs 2` 423 s (engine
start-ups went from a 5.2 s to a 13 s median, two workers contending for two cores), at ~9 GiB more memory.
So the default is one process; `auto` gives a worker per CORES_PER_WORKER cores, bounded by available memory
(PER_WORKER_GIB; measured: ~4 GiB a worker, with room to spare), for larger machines.
"""

from __future__ import annotations

import os

PER_WORKER_GIB = 7.0
CORES_PER_WORKER = 2
MAX_WORKERS = 4


def available_gib() -> float:
    """MemAvailable from /proc/meminfo (0 where it cannot be read: then one worker)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def xdist_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None


def jobs(spec: str | int | None) -> int:
    """`spec`: a number of workers, or "auto": min(cores / CORES_PER_WORKER, available memory / PER_WORKER_GIB,
    MAX_WORKERS), at least 1; always 1 without pytest-xdist."""
    if not xdist_installed():
        return 1
    if spec is not None and spec not in ("", "auto"):
        n = int(spec)
        if n < 1:
            raise ValueError(f"--jobs must be >= 1 or auto, got {spec}")
        return n
    cores = (os.cpu_count() or 1) // CORES_PER_WORKER
    return max(1, min(cores, int(available_gib() // PER_WORKER_GIB), MAX_WORKERS))


def pytest_args(n: int) -> list[str]:
    return ["-n", str(n), "--dist", "loadgroup"] if n > 1 else []
