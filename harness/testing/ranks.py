"""What each tensor-parallel rank of a running generator did: the checks that only exist across ranks.

speculators asks `collective_rpc(..., unique_reply_rank=0)` for the captured states, captures on TP rank 0 only
(`_store_captured_states` runs where its worker extension says so), and every worker applies the shims it was
set up with. At TP=1 none of this can fail; at TP=N each is a property of N worker processes. `rank_facts` runs in
every worker (through `_harness_call`); `judged` turns the list into what a report row says.
"""

from __future__ import annotations


def tp_rank(worker) -> int:
    from vllm.distributed import get_tp_group

    return int(get_tp_group().rank_in_group)


def rank_facts(worker) -> dict:
    """This worker's rank, how many times it stored captured states, whether it made a hand-off buffer (host
    shared memory or device), and which shims it applies."""
    publisher = getattr(worker, "_harness_publisher", None)
    device = getattr(worker, "_harness_device_stream", None)
    buffers = (publisher.grown if publisher is not None else 0) + (
        device.publisher.grown if device is not None and hasattr(device.publisher, "grown") else 0
    )
    return {
        "rank": tp_rank(worker),
        "captures": int(worker._harness_capture_count()),
        "hand_off_buffers": int(buffers),
        "shims": sorted(worker._harness_engaged_shims()),
    }


def problems(facts: list[dict], replied: int, size: int) -> list[str]:
    """What the ranks did that speculators does not assume."""
    ranks = sorted(f["rank"] for f in facts)
    first = next((f for f in facts if f["rank"] == 0), None)
    others = [f for f in facts if f["rank"] != 0]
    out = []
    if ranks != list(range(size)):
        out.append(f"ranks {ranks}, not 0..{size - 1}")
    if replied != 0:
        out.append(f"the reply asked of rank 0 came from rank {replied}")
    if first is None or first["captures"] == 0:
        out.append("rank 0 stored no captured states")
    out += [f"rank {f['rank']} stored captured states {f['captures']} times" for f in others if f["captures"]]
    out += [f"rank {f['rank']} made {f['hand_off_buffers']} hand-off buffers" for f in others if f["hand_off_buffers"]]
    if len({tuple(f["shims"]) for f in facts}) != 1:
        out.append("the ranks apply different shims: " + "; ".join(f"rank {f['rank']}: {f['shims']}" for f in facts))
    return out


def judged(facts: list[dict], replied: int, size: int) -> tuple[bool, str]:
    """Whether the ranks behaved as speculators assumes, and the row's text."""
    first = next((f for f in facts if f["rank"] == 0), None)
    others = [f for f in facts if f["rank"] != 0]
    found = problems(facts, replied, size)
    said = (
        f"{size} ranks; the reply asked of rank 0 from rank {replied}; captures per rank "
        + ", ".join(f"{f['rank']}: {f['captures']}" for f in sorted(facts, key=lambda f: f["rank"]))
        + f"; hand-off buffers on other ranks: {sum(f['hand_off_buffers'] for f in others)}; "
        + f"{len(first['shims']) if first else 0} shims on every rank"
    )
    return not found, said + ("" if not found else " -- " + "; ".join(found))


def resident_gib(gen) -> float:
    """The workers' resident memory together, in GiB (what N ranks cost this machine, the driver aside)."""
    import psutil

    from harness.runtime.executor_view import worker_procs

    total = 0
    for _, proc in worker_procs(gen.real_executor):
        try:
            total += psutil.Process(proc.pid).memory_info().rss
        except psutil.Error:
            continue
    return total / (1 << 30)
