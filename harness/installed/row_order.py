"""The order in which a model runner captured a step's rows, read from the runner the worker built, and the
ranges that put them back in the order speculators added the requests (C-chunkedprefill's worker half).

vLLM's V1 runners keep a persistent batch whose `req_ids` are a step's capture order; the V2 runners (the only
ones from vLLM 0.34) build a fresh `InputBatch` per step in `prepare_inputs`, sorted by scheduled token count, and
keep none. Which one a worker has is read off the runner itself, never off a version.
"""

from __future__ import annotations

#: The persistent batch of a V1 runner, and the method in which a V2 runner builds each step's batch.
BATCH_ATTRIBUTE = "input_batch"
STEP_BATCH_METHOD = "prepare_inputs"


def record_step_batches(runner) -> None:
    """A runner without a persistent batch (vLLM's V2 runners, the only ones from 0.34) builds each step's
    `InputBatch` in `prepare_inputs`, in its own order (sorted by scheduled token count): keep the request ids of
    the last one built, which are the order of the rows its forward captures."""
    if hasattr(runner, BATCH_ATTRIBUTE) or runner.__dict__.get("_harness_step_batches"):
        return
    inner = getattr(runner, STEP_BATCH_METHOD)

    def prepare_inputs(*args, **kwargs):
        batch = inner(*args, **kwargs)
        runner._harness_step_req_ids = list(batch.req_ids)
        return batch

    setattr(runner, STEP_BATCH_METHOD, prepare_inputs)
    runner._harness_step_batches = True


def step_order(runner, scheduled: dict) -> list[str]:
    """The requests of the step just run, in the order their rows were captured: the persistent batch's order
    (V1 runners), else the order of the step's own `InputBatch` (V2, see `record_step_batches`)."""
    batch = getattr(runner, BATCH_ATTRIBUTE, None)
    ids = batch.req_ids if batch is not None else getattr(runner, "_harness_step_req_ids", None)
    if ids is None:
        raise RuntimeError(f"{type(runner).__name__} keeps no {BATCH_ATTRIBUTE} and no step batch was recorded")
    return [r for r in ids if r is not None and r in scheduled]


def request_ranges(segments: list, arrivals: list[str], total: int) -> list[tuple[int, int]] | None:
    """The (start, rows) ranges of the captured rows, in arrival order of their requests; None where nothing
    needs to move or the records do not cover the `total` rows (the row check then says what is wrong)."""
    flat = [seg for step in segments for seg in step]
    if not flat or sum(n for _, n in flat) != total:
        return None
    chunks: dict[str, list[tuple[int, int]]] = {}
    offset = 0
    for req_id, n in flat:
        chunks.setdefault(req_id, []).append((offset, n))
        offset += n
    if set(chunks) != set(arrivals) or len(chunks) != len(arrivals):
        return None
    ranges = [r for req in arrivals for r in chunks[req]]
    starts = [start for start, _ in ranges]
    return None if starts == sorted(starts) else ranges
