"""Room in memory for one more of the session's shared generators.

The suites keep one generator per tiny model for the whole session, which is what makes a run fast. Where a
vLLM build's workers are large (0.30's CPU worker holds ~4.8 GiB after start whatever the model: for tiny Llama
in float32 its KV cache tensors take 3,856 MiB where VLLM_CPU_KVCACHE_SPACE asks 1 GiB), four of them do not fit
a 24 GiB machine and the kernel kills one mid-run. Before a start, the generators least likely to be needed next
are closed until two of the largest worker seen so far fit (the one starting, and one more for a test that starts
its own: a shim proof, a fresh child); a closed one is started again when a test asks for it. Nothing is closed
where memory is plentiful, so on most builds a run is unchanged."""

from __future__ import annotations

import contextlib

#: Kept free beyond two of the largest worker seen: the caller's buffers and short-lived helpers.
MARGIN_BYTES = 1 << 30


def available_bytes() -> int:
    """The kernel's estimate of memory a new process can take without swapping (MemAvailable)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def worker_bytes(generator) -> int:
    """Resident memory of a generator's worker processes (0 where they have gone)."""
    import psutil

    from harness.runtime.executor_view import worker_procs

    total = 0
    for _, proc in worker_procs(generator.real_executor):
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(proc.pid).memory_info().rss
    return total


def to_close(live: list[tuple[str, object]], available: int | None = None) -> list[str]:
    """Names of `live` generators (oldest use first) to close before one more starts: none while two of the
    largest worker seen fit with MARGIN_BYTES to spare; else the most recently used first. Tests of one model run
    in turn over the four models, so the one just used is the one needed last (evicting the oldest would restart
    a generator at every test)."""
    sizes = {name: worker_bytes(gen) for name, gen in live}
    if not sizes:
        return []
    need = 2 * max(sizes.values()) + MARGIN_BYTES
    room = available_bytes() if available is None else available
    out = []
    for name, _ in reversed(live):
        if room >= need:
            break
        out.append(name)
        room += sizes[name]
    return out
