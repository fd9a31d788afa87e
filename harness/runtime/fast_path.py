"""`generate(..., fast=True)`: speculators 0.3.0's extraction loop, minus the two costs that are its own.

speculators' `generate()` runs one synchronous step at a time: it waits for each forward, then finishes the step's
requests and schedules the next step while the device idles; after the last step it `.clone()`s every prompt's
rows of every layer (at the Kimi-K2.5 width 5.6 GiB a call, ~0.25 s of host-memory bandwidth). The fast path drives
the same objects in the same order -- speculators' scheduler (with every shim on it), the requests it would build
(its own `Request`, `SamplingParams` and constants, looked up in the rebound namespace, so the request shims apply),
the same `_reset_capture`/`execute_model`/`_get_captured_states` calls through the executor view -- with two
changes: each step is sent without waiting for its reply (`ExecutorView.submit_step`, vLLM's `non_block`), its
requests are finished and the next step scheduled while the worker runs it, and what a step shim sends after it
(C-twophase's `sample_tokens`) is not waited for either, so the next step is already queued on the workers when
they finish one (`ExecutorView.steps_in_flight`); and each prompt's rows are handed out as views of the hand-off
buffer, not copies.

What the views mean for the caller: the buffer is reused by the next call on the same generator. Rows of a
fast call that are still referenced when the next call starts are moved to memory of their own first
(`detach_views`: a copy only for what is kept), so a result never changes under its holder; a view the caller made
of such a tensor (a slice) is not tracked and still points at the buffer. Scheduling ahead is safe because every
scheduled request is finished before the next `schedule()` (prefill only: no step's output feeds the next), the
worker runs steps in the order they were sent, and a request mid-prefill keeps its place (C-chunkedprefill).
The results are bitwise those of speculators' loop: `suites/e2e/test_fast_path.py` on every CPU build, the GPU tier.
"""

from __future__ import annotations

import weakref
from typing import Any

#: speculators' module constants its loop builds requests with (read from its namespace, never copied).
REQUEST_CONSTANTS = ("MAX_DECODE_TOKENS", "SAMPLING_TEMPERATURE", "INITIAL_ARRIVAL_TIME")


def generate(spec: Any, prompts: list[list[int]]) -> tuple[list[dict], int]:
    """Run one batch on speculators' generator object `spec` (its class rebound by the harness); returns the
    results in speculators' format, with views as hidden states, and how many steps were sent ahead."""
    import torch

    names = type(spec).generate.__globals__  # speculators' module globals with the shims in place
    request, sampling, status = names["Request"], names["SamplingParams"], names["RequestStatus"]
    max_tokens, temperature, arrival = (names[k] for k in REQUEST_CONSTANTS)
    limit = spec.vllm_config.model_config.max_model_len - 1
    prompts = [list(p[:limit]) for p in prompts]
    scheduler, executor = spec.scheduler, spec.executor
    for i, ids in enumerate(prompts):
        scheduler.add_request(
            request(
                request_id=f"req_{spec._request_counter}_{i}",
                prompt_token_ids=ids,
                sampling_params=sampling(max_tokens=max_tokens, temperature=temperature),
                pooling_params=None,
                eos_token_id=spec.tokenizer.eos_token_id,
                arrival_time=arrival,
            )
        )
    spec._request_counter += 1
    executor.collective_rpc("_reset_capture")
    ahead = 0
    out = scheduler.schedule()
    with executor.steps_in_flight():
        while out.total_num_scheduled_tokens > 0:
            step = executor.submit_step(out)
            for request_id in out.num_scheduled_tokens:
                scheduler.finish_requests([request_id], status.FINISHED_ABORTED)
            following = scheduler.schedule()  # while the worker runs `out`
            step.result()
            ahead += following.total_num_scheduled_tokens > 0
            out = following
    states = executor.collective_rpc("_get_captured_states", unique_reply_rank=0)[0]
    if not states:
        raise RuntimeError("Failed to capture hidden states from worker")
    results, offset = [], 0
    for ids in prompts:
        results.append(
            {
                "input_ids": torch.as_tensor(ids, dtype=torch.long),
                "hidden_states": [h[offset : offset + len(ids)] for h in states],
                "loss_mask": None,
            }
        )
        offset += len(ids)
    return results, ahead


class Views:
    """The hidden-state views a fast call handed out, weakly: what must leave the buffer before it is reused."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref] = []
        self.detached = 0  # tensors moved to their own memory because they were still held at the next call

    def track(self, results: list[dict]) -> None:
        self._refs = [weakref.ref(t) for r in results for t in r["hidden_states"]]

    def detach_views(self) -> int:
        """Before the buffer is written again: give every still-referenced view memory of its own, in place
        (`Tensor.set_`: its holders see the same values in a copy). Returns how many were."""
        held = [t for t in (ref() for ref in self._refs) if t is not None]
        for t in held:
            t.set_(t.clone())
        self._refs = []
        self.detached += len(held)
        return len(held)
