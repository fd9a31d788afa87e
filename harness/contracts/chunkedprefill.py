"""C-chunkedprefill: every prompt of a batch comes back complete and its rows are its own (in request order),
whatever the batch's size, the lengths of its prompts and the number of batches before it.

speculators 0.3.0 finishes every request it saw scheduled after one `schedule()` step and slices the captured rows
in the order it added the requests. Real batches (40 prompts of 300 tokens, 5 of 2,000) break both:

* over one step's budget (`max_num_batched_tokens`, 8192) with chunked prefill on (V1's default from 0.12), a
  straddling prompt is finished after its first chunk and comes back short (speculators 0.4.0 fixed its loop);
  with it off (0.11), waiting prompts are scheduled last-in first-out: every count matches, but prompts get
  other prompts' rows, silently;
* the V2 runners vLLM 0.34 builds sort each step's requests by scheduled token count, so prompts of unequal
  lengths are captured out of order even within one step;
* speculators' loop ends at the first `schedule()` that schedules nothing and never executes it, and that output
  carries the batch's finished requests. V1 runners drop requests that are not scheduled; the V2 runners hold a
  slot per request until its finish reaches them, so after `max_num_seqs` (32) requests over all calls the next
  step fails ("No free indices", vllm/v1/worker/cpu/states.py, the GPU runner's likewise).

Shim, two halves. Driver: speculators' scheduler finishes only requests whose prefill is done (a request
mid-prefill stays running for its next chunk), records the order requests were added in, and keeps the finished
ids of an output that speculators does not execute for the next step that runs (as EngineCore, which never
schedules without work). Worker: each
forward's requests in the order the runner captured their rows (`step_order`: a V1 runner's persistent batch, or
the batch a V2 runner builds per step in `prepare_inputs`). The driver announces the batch's order and prompt
lengths (`set_arrivals`); each forward's rows go straight to their place in the hand-off (`rows_placement`) or
are regrouped on the device (`in_request_order`), so that speculators' own slicing is right. Row counts cannot
show a reordering: the probe compares rows with the prompts extracted on their own, the e2e suite with
transformers.
"""

from __future__ import annotations

from typing import Any

from harness.contracts.base import Attach, Attempt, Contract, GateCover, Observation, Shim
from harness.installed.row_order import (
    BATCH_ATTRIBUTE,
    STEP_BATCH_METHOD,
    record_step_batches,
    request_ranges,
    step_order,
)
from harness.subjects.batches import PROMPT_TOKENS, each_own, in_order, repeated_calls, straddling_batch, unequal_batch
from harness.vllm_source.facts import Fact

#: The attribute on speculators' scheduler that holds the guard (tests and the probe switch it).
GUARD = "_harness_prefill_guard"


class PrefillGuard:
    """Wraps one scheduler's `finish_requests` (requests mid-prefill are kept running, when `enabled`) and its
    `schedule` (finished requests reach the runner, when `release`)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.enabled = True
        self.release = True
        self.carried = 0  # finished request ids carried over from an output speculators does not execute
        self.dropped: set[str] = set()  # ids such outputs lost while `release` was off (what speculators alone does)
        self._schedule = scheduler.schedule
        self.kept = 0  # finish calls held back for a request mid-prefill (the shim engaged)
        self.cut = 0  # requests finished mid-prefill while the guard was off (what speculators alone does)
        self.arrivals: list[str] = []  # request ids in the order speculators added them (since the last take)
        self.lengths: list[int] = []  # their prompt lengths
        self._finish = scheduler.finish_requests
        self._add = scheduler.add_request

    def add_request(self, request) -> None:
        self.arrivals.append(request.request_id)
        self.lengths.append(int(request.num_prompt_tokens))
        return self._add(request)

    def take(self) -> tuple[list[str], list[int]]:
        """This batch's request ids in arrival order and their prompt lengths; the next batch starts anew. Only
        requests the scheduler still holds: one added and finished outside `generate()` (a probe's lone step) is
        no row of this batch, and announced it would shift every row after it."""
        live = self.scheduler.requests
        kept = [(r, n) for r, n in zip(self.arrivals, self.lengths, strict=True) if r in live]
        self.arrivals, self.lengths = [], []
        return [r for r, _ in kept], [n for _, n in kept]

    def mid_prefill(self, request_id: str) -> bool:
        req = self.scheduler.requests.get(request_id)
        return req is not None and req.num_computed_tokens < req.num_prompt_tokens

    def schedule(self):
        """speculators stops at the first `schedule()` that schedules no tokens, and never executes it; that output
        carries the requests it finished in the batch's last step (the scheduler hands finished ids out once), so
        they never reach the runner. EngineCore never schedules without work: the ids wait for the next step that
        runs. Do the same: put them back, so the next batch's first step releases them in the runner."""
        out = self._schedule()
        finished = set(getattr(out, "finished_req_ids", None) or ())
        if out.total_num_scheduled_tokens == 0 and finished:
            if self.release:
                self.scheduler.finished_req_ids |= finished
                self.carried += len(finished)
            else:
                self.dropped |= finished
        return out

    def recover(self) -> None:
        """After a run with `release` off: abort what a failed step left scheduled and hand the runner every id
        it missed, so that the next step frees their slots (the probe shares its generator with the suite)."""
        left = list(self.scheduler.requests)
        if left:
            from vllm.v1.request import RequestStatus

            self._finish(left, RequestStatus.FINISHED_ABORTED)
        self.scheduler.finished_req_ids |= self.dropped
        self.dropped = set()

    def finish_requests(self, request_ids, finished_status) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        mid = [i for i in ids if self.mid_prefill(i)]
        if not self.enabled:
            self.cut += len(mid)
            return self._finish(ids, finished_status)
        self.kept += len(mid)
        done = [i for i in ids if i not in mid]
        if done:
            self._finish(done, finished_status)


def apply(ns: dict, current, state=None) -> None:
    """Wraps the Scheduler speculators builds (after C-sched's wrapper) with a PrefillGuard."""
    real = current("Scheduler")

    def Scheduler(**kwargs):  # noqa: N802
        sched = real(**kwargs)
        guard = PrefillGuard(sched)
        sched.finish_requests = guard.finish_requests
        sched.add_request = guard.add_request
        sched.schedule = guard.schedule
        setattr(sched, GUARD, guard)
        if state is not None:
            state.per_contract[CONTRACT.id] = guard
        return sched

    ns["Scheduler"] = Scheduler


def apply_worker(worker) -> None:
    """Record, for every forward, the requests in the runner's batch order and their scheduled token counts."""
    if worker.__dict__.get("_harness_segments_recorded"):
        return
    record_step_batches(worker.model_runner)
    inner = worker.execute_model
    worker._harness_segments = []

    def execute_model(scheduler_output, *args, **kwargs):
        out = inner(scheduler_output, *args, **kwargs)
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        if scheduled:
            order = step_order(worker.model_runner, scheduled)
            worker._harness_segments.append([(r, int(scheduled[r])) for r in order])
        return out

    worker.execute_model = execute_model
    worker._harness_segments_recorded = True


def announce_order(view, state) -> None:
    """Driver side, once speculators has added a batch's requests: tell the workers their order and prompt
    lengths (only while the guard is on: the proof's unshimmed run must see speculators' own slicing)."""
    guard = state.per_contract.get(CONTRACT.id)
    if guard is not None:
        arrivals, lengths = guard.take()
        sent = (arrivals, lengths) if guard.enabled else (None, None)
        view.collective_rpc("_harness_call", args=(set_arrivals, *sent))


def set_arrivals(worker, arrivals: list[str] | None, lengths: list[int] | None = None) -> None:
    """RPC body, sent by the driver before a batch's first step: the order speculators added its requests in
    and their prompt lengths (None: leave the rows as captured, the shim is off)."""
    worker._harness_arrivals = list(arrivals) if arrivals is not None else None
    worker._harness_places = None
    if arrivals is not None and lengths is not None and len(lengths) == len(arrivals):
        starts, at = {}, 0
        for req, n in zip(arrivals, lengths, strict=True):
            starts[req] = (at, int(n))
            at += int(n)
        worker._harness_places = {"starts": starts, "done": dict.fromkeys(starts, 0), "total": at, "moved": False}


def reset(worker) -> None:
    worker._harness_segments = []
    worker._harness_arrivals = None
    worker._harness_places = None


def rows_placement(worker, scheduler_output, rows: int):
    """Where one forward's captured rows go, per request in arrival order: (total rows of the batch, [(source
    row, destination row, count)]), or None where this step cannot be placed (no arrivals announced, a request
    not announced, more rows than its prompt, rows that do not match the scheduled tokens). The layout is the
    one `in_request_order` produces; a batch whose rows move out of capture order counts as regrouped."""
    places = getattr(worker, "_harness_places", None)
    scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    if places is None or not scheduled:
        return None
    order = step_order(worker.model_runner, scheduled)
    moves, src = [], 0
    for req in order:
        n = int(scheduled[req])
        if req not in places["starts"]:
            return None
        start, length = places["starts"][req]
        done = places["done"][req]
        if done + n > length:
            return None
        moves.append((src, start + done, n))
        places["done"][req] = done + n
        src += n
    if src != rows:
        return None
    captured_so_far = places.setdefault("captured", 0)
    if not places["moved"] and any(dst != captured_so_far + s for s, dst, _ in moves):
        places["moved"] = True
        worker._harness_reorder_count = getattr(worker, "_harness_reorder_count", 0) + 1
    places["captured"] = captured_so_far + rows
    return places["total"], moves


def in_request_order(worker, states: list) -> list:
    """Worker side, before the states leave the device: the captured rows regrouped per request, in the order
    speculators added the requests, so that its contiguous slicing gives each prompt its own rows. A gather
    on the device (a copy of the captured bytes at device bandwidth); the host sees each byte once."""
    import torch

    arrivals, segments = getattr(worker, "_harness_arrivals", None), getattr(worker, "_harness_segments", [])
    worker._harness_segments, worker._harness_arrivals = [], None
    if not arrivals or not states:
        return states
    ranges = request_ranges(segments, arrivals, int(states[0].shape[0]))
    if ranges is None:
        return states
    worker._harness_reorder_count = getattr(worker, "_harness_reorder_count", 0) + 1
    return [torch.cat([h[start : start + n] for start, n in ranges]) for h in states]


def reordered(worker) -> int:
    """RPC body: how many batches this worker has regrouped so far."""
    return getattr(worker, "_harness_reorder_count", 0)


def proof_run(gen) -> None:
    """The shim proof's run: a batch that straddles the generator's step budget, one step of unequal prompts (rows
    checked for order), and calls of short batches past the scheduler's `max_num_seqs` requests in all."""
    sc = gen.vllm_config.scheduler_config
    in_order(gen, straddling_batch(int(sc.max_num_batched_tokens), gen.vocab_size))
    each_own(gen, unequal_batch(gen.vocab_size))
    repeated_calls(gen, int(sc.max_num_seqs))


def chunked(scheduler_config) -> bool:
    """Whether the scheduler may split a prompt across steps (the field's name differs across versions)."""
    for name in ("enable_chunked_prefill", "chunked_prefill_enabled"):
        value = getattr(scheduler_config, name, None)
        if value is not None:
            return bool(value)
    return False


def cause(scheduler_config, prompt_lengths: list[int]) -> str | None:
    """Why rows can go missing in this batch, when chunked prefill explains it (for the row check's error)."""
    budget = int(scheduler_config.max_num_batched_tokens)
    if chunked(scheduler_config) and sum(prompt_lengths) > budget:
        return (
            f"a prompt was split across scheduler steps (chunked prefill on, max_num_batched_tokens={budget}, "
            f"batch of {sum(prompt_lengths)} tokens) and speculators finished it after its first chunk"
        )
    return None


def probe(ctx) -> Observation:
    gen = ctx.generator
    sc = ctx.vllm_config.scheduler_config
    guard = getattr(gen.scheduler, GUARD, None)
    facts: dict[str, Any] = {
        "chunked_prefill_enabled": chunked(sc),
        "max_num_batched_tokens": int(sc.max_num_batched_tokens),
        "max_num_seqs": int(sc.max_num_seqs),
    }
    if guard is None:
        return Observation(
            CONTRACT, Attempt.failed("RuntimeError", "the shared generator has no prefill guard"), None, facts
        )
    batch = straddling_batch(facts["max_num_batched_tokens"], ctx.model.vocab_size)
    facts["batch"] = f"{len(batch)} prompts x {PROMPT_TOKENS} tokens = {len(batch) * PROMPT_TOKENS} tokens"
    regrouped = lambda: gen.executor_view.collective_rpc(reordered)[0]  # noqa: E731 - rank 0 captures
    unequal = unequal_batch(ctx.model.vocab_size)
    guard.enabled, cut_before, kept_before, regrouped_before = False, guard.cut, guard.kept, regrouped()
    try:
        straddling, _ = Attempt.run(lambda: in_order(gen, batch))
        one_step, _ = Attempt.run(lambda: each_own(gen, unequal))
    finally:
        guard.enabled = True
    carried_before, guard.release = guard.carried, False
    try:
        repeated, _ = Attempt.run(lambda: repeated_calls(gen, facts["max_num_seqs"]))
    finally:
        guard.release = True
        facts["finished_ids_lost_unshimmed"] = len(guard.dropped)
        guard.recover()
    facts["finished_mid_prefill_unshimmed"] = guard.cut - cut_before
    facts["unequal_step_unshimmed"] = one_step.text
    facts["repeated_calls_unshimmed"] = repeated.text
    unshimmed = next((a for a in (straddling, one_step, repeated) if not a.ok), straddling)
    shimmed = None
    if not unshimmed.ok:

        def shimmed_checks() -> None:
            in_order(gen, batch)
            each_own(gen, unequal)
            repeated_calls(gen, facts["max_num_seqs"])

        shimmed, _ = Attempt.run(shimmed_checks)
        facts["kept_running_shimmed"] = guard.kept - kept_before
        facts["regrouped_shimmed"] = regrouped() - regrouped_before
        facts["finished_ids_carried_shimmed"] = guard.carried - carried_before
    facts["shim_selected"] = guard.kept - kept_before > 0 or regrouped() - regrouped_before > 0 or not repeated.ok
    return Observation(CONTRACT, unshimmed, shimmed, facts)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------


def runner_facts(tree, used, follower) -> list[Fact]:
    """Per worker module (GPU, CPU): whether the runners it builds by default keep a persistent `input_batch`
    (V1; else `record_step_batches` reads the batch each step builds in `prepare_inputs`, where there is one), and
    whether they sort a step's requests by token count (then rows sliced in arrival order belong to other prompts
    unless regrouped from the step's own order). The scheduler's own behaviour stays outside (`gate_outside`)."""
    from harness.vllm_source import runners

    facts = []
    for worker, cls in runners.WORKERS.items():
        read = runners.read(str(tree.root), worker)
        symbol = f"{worker}:{cls}.model_runner"
        if read.file is None:
            facts.append(
                Fact(
                    CONTRACT.id,
                    symbol,
                    "runner-class",
                    f"{worker} not in these sources",
                    None,
                    evidence=f"{worker.replace('.', '/')}.py (no such module)",
                )
            )
            continue
        defaults = read.defaults
        if not defaults:
            facts.append(
                Fact(
                    CONTRACT.id,
                    symbol,
                    "runner-class",
                    f"no model runner built by {worker} was found",
                    None,
                    evidence=f"{read.file}:1",
                )
            )
            continue
        lacking = [r for r in defaults if BATCH_ATTRIBUTE not in r.attributes]
        unreadable = [r for r in lacking if STEP_BATCH_METHOD not in r.attributes]
        names = ", ".join(
            runners.describe(r)
            + (
                f" (keeps {BATCH_ATTRIBUTE})"
                if r not in lacking
                else f" (builds each step's batch in {STEP_BATCH_METHOD})"
                if r not in unreadable
                else ""
            )
            for r in defaults
        )
        first = (lacking or defaults)[0]
        readable = not unreadable
        facts.append(
            Fact(
                CONTRACT.id,
                symbol,
                "runner-class",
                f"builds {names}",
                not lacking,
                "runner-replaced",
                read.where_built(first.path),
                detail={
                    "runners": [r.path for r in defaults],
                    "step_order_readable": readable,
                    "why": (
                        f"the worker shim reads a step's request order from "
                        f"worker.model_runner.{BATCH_ATTRIBUTE}.req_ids, which "
                        f"{', '.join(runners.describe(r) for r in lacking)} does not keep"
                        + (
                            ""
                            if readable
                            else f", nor does it build a step batch in {STEP_BATCH_METHOD}: no shim reads its order"
                        )
                    ),
                },
            )
        )
        sorting = [r for r in defaults if r.sorts_steps]
        facts.append(
            Fact(
                CONTRACT.id,
                symbol,
                "step-order",
                f"sorted by scheduled token count ({runners.describe(sorting[0])})"
                if sorting
                else "the runner's persistent batch order",
                not sorting,
                "step-order-sorted",
                sorting[0].sorts_steps if sorting else read.where_built(defaults[0].path),
                detail={
                    "step_order_readable": readable,
                    "why": "rows sliced in the order requests were added would belong to other prompts"
                    + ("" if readable else "; the runner exposes no step order to regroup by"),
                },
            )
        )
    return facts


CONTRACT = Contract(
    id="chunkedprefill",
    assumes="a batch larger than one scheduler step comes back complete, each prompt's rows its own",
    failures=(
        r"split across scheduler steps",
        r"came back with \[.*\] rows per layer",
        r"not in request order",
        r"No free indices",
    ),
    shims=(
        Shim(Attach.GENERATOR, apply),
        Shim(Attach.BATCH_START, announce_order),
        Shim(Attach.WORKER, apply_worker),
        Shim(Attach.WORKER_STATES, in_request_order),
        Shim(Attach.WORKER_ROWS, rows_placement),
        Shim(Attach.WORKER_RESET, reset),
    ),
    gate_outside="whether a batch over one step's budget is chunked or reordered is the scheduler's behaviour "
    "under load (defaults, queue order), not a signature: each env's run extracts such a batch",
    gate_checks=(runner_facts,),
    gate_covers=(
        GateCover(
            "runner-replaced",
            apply_worker,
            "reads each step's request order from the batch the runner builds in prepare_inputs (record_step_batches)",
            lambda f: bool(f.detail.get("step_order_readable")),
            "the runner builds a step batch",
        ),
        GateCover(
            "step-order-sorted",
            in_request_order,
            "regroups each step's rows per request from the order the runner captured them in "
            "(on the device, or placed straight into the hand-off by rows_placement)",
            lambda f: bool(f.detail.get("step_order_readable")),
            "the step's order is readable",
        ),
    ),
    upstream=(
        "not one change: chunked prefill on by default in V1 (0.12.0 on in the config speculators "
        "builds); speculators 0.4.0 fixed its own loop with per-request bookkeeping. vLLM 0.34.0 deleted the "
        "V1 model runner (vllm/v1/worker/gpu_model_runner.py, cpu_model_runner.py, gpu_input_batch.py): the "
        "workers build the V2 runner (vllm/v1/worker/gpu/model_runner.py; vLLM #25266 added it, #41286 tracks the migration), which builds an "
        "InputBatch per step and sorts a step's requests by scheduled token count (sort_batch_req_ids); the worker "
        "shim reads that step batch instead (record_step_batches). The V2 runners free a request's slot only when its id "
        "arrives in finished_req_ids (CPURequestState.remove_request; V1 runners removed unscheduled requests "
        "from the persistent batch every step), hence the carried finished ids"
    ),
)
