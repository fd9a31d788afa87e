"""C-twophase: `execute_model(scheduler_output)` can be called step after step.

From vLLM 0.11.1 the model runner's `execute_model()` runs the forward, parks its state and returns
None; `sample_tokens()` must consume that state before the next `execute_model()`, else
"State error: sample_tokens() must be called after execute_model() returns None." speculators
never calls `sample_tokens()`, so its second scheduler step (more than 32 prompts, or a second
`generate()`) fails. The guard is unconditional: it does not depend on `async_scheduling`.
Shim (on the executor view): after an `execute_model()` that returned None, call
`sample_tokens(None)` (no grammar), as EngineCore does; on the fast path it is sent without waiting, the next
step queued behind it (`ExecutorView.send_behind`).
"""

from __future__ import annotations

from harness.contracts.base import Attach, Contract, GateCover, Observation, Shim
from harness.vllm_source.facts import Fact
from harness.vllm_source.lookups import not_found, site


def sample_after_step(view, output) -> bool:
    """After an execute_model() that returned None, call sample_tokens(None) as EngineCore does: the runner
    parked its state for it, and speculators never calls it, so its next execute_model() would fail."""
    if output is None and hasattr(view.real, "sample_tokens"):
        view.send_behind(view.real.sample_tokens, None)
        return True
    return False


def _step(ctx, sched, n_tokens: int):
    req = ctx.new_request(ctx.vllm_config, ctx.prompt(n_tokens))
    sched.add_request(req)
    return req, sched.schedule()


def observe(ctx, gen) -> dict:
    """Drive one generator's real executor through the protocol and say what happened."""
    from harness.contracts.base import Attempt as A

    real, view, sched = gen.real_executor, gen.executor_view, gen.scheduler
    done = ctx.finished_aborted()
    seen: dict = {"async_scheduling": gen.vllm_config.scheduler_config.async_scheduling}
    r1, o1 = _step(ctx, sched, 5)
    first = real.execute_model(o1)
    seen["execute_model_returns"] = type(first).__name__
    sched.finish_requests([r1.request_id], done)
    r2, o2 = _step(ctx, sched, 5)
    second, _ = A.run(lambda: real.execute_model(o2))
    seen["second_execute_model"] = second.text
    if hasattr(real, "sample_tokens"):
        clear, _ = A.run(lambda: real.sample_tokens(None))
        seen["executor_sample_tokens_none"] = clear.text
    if not second.ok:
        # The runner never saw o2 (the guard raises first): send it again through the shim.
        shimmed, _ = A.run(lambda: view.execute_model(o2))
    else:
        shimmed = second
    sched.finish_requests([r2.request_id], done)
    r3, o3 = _step(ctx, sched, 5)
    again, _ = A.run(lambda: view.execute_model(o3))
    sched.finish_requests([r3.request_id], done)
    if first is None:
        r4, o4 = _step(ctx, sched, 5)
        real.execute_model(o4)
        worker_level, _ = A.run(lambda: real.collective_rpc("sample_tokens", args=(None,)))
        seen["worker_sample_tokens_none"] = worker_level.text
        sched.finish_requests([r4.request_id], done)
    seen["shimmed_steps"] = [shimmed.text, again.text]
    return {"unshimmed": second, "shimmed": shimmed if not shimmed.ok else again, "seen": seen}


def probe(ctx) -> Observation:
    """Classified on speculators' own configuration (the shared generator); the other async_scheduling
    value, where the platform lets it run, is observed too and recorded (the guard is unconditional)."""
    primary = observe(ctx, ctx.generator)
    requested = bool(ctx.vllm_config.scheduler_config.async_scheduling)
    per_mode = {str(requested): dict(primary["seen"], config="speculators' own")}
    other = ctx.generator_for(async_scheduling=not requested)
    if other is None:
        per_mode[str(not requested)] = ctx.unobservable_async(not requested)
    else:
        try:
            per_mode[str(not requested)] = dict(observe(ctx, other)["seen"], config="async_scheduling forced")
        finally:
            ctx.release(other)
    facts = {"by_async_scheduling": per_mode, "shim_selected": "engages when execute_model returns None"}
    unshimmed = primary["unshimmed"]
    return Observation.of(CONTRACT, unshimmed, primary["shimmed"], facts)


# -- the static gate's check (harness.gate reads vLLM's sources with it, never imports them) ----------------
RUNNER = "vllm.v1.worker.gpu_model_runner"  # where the guard lived up to 0.33 (the V1 runner)
STATE_ERROR = "sample_tokens() must be called"
#: The V2 runner parks a step's state on itself between execute_model() and sample_tokens(), without a guard.
PARKED_STATE = "execute_model_state"


def _guard(tree) -> tuple[str | None, str]:
    """Where the runners the GPU worker builds park a step's state: (evidence file:line or None, how), read in
    the runners' own files (bases included), else in the V1 runner module where it still exists."""
    from harness.vllm_source import runners
    from harness.vllm_source.source_files import module_of

    built = runners.read(str(tree.root), "vllm.v1.worker.gpu_worker").defaults
    for r in built:
        for rel in r.files:
            lines = tree.string_lines(module_of(rel), STATE_ERROR)
            if lines:
                return f"{rel}:{lines[0]}", f"State error guard in {runners.describe(r)}"
    for r in built:
        if PARKED_STATE in r.attributes:
            return r.attributes[PARKED_STATE], f"{runners.describe(r)}.{PARKED_STATE}, no State error guard"
    lines = tree.string_lines(RUNNER, STATE_ERROR)
    runner = tree.module_file(RUNNER)
    if lines and runner is not None:
        return f"{runner.relative_to(tree.root)}:{lines[0]}", "State error guard"
    return None, (
        "the V1 runner module is gone and no runner the worker builds was read" if runner is None else "no guard"
    )


def two_phase(tree, used, follower) -> list[Fact]:
    facts = []
    for call in (c for c in used.calls if c.callee.endswith(".execute_model")):
        ref = follower.follow(call.module, call.callee)
        symbol = ref.symbol if ref else call.callee
        if not ref or ref.obj is None or not ref.steps:
            facts.append(not_found(CONTRACT.id, symbol, "protocol", "execute_model"))
            continue
        executor = ref.steps[-1][1]
        sample = tree.member(executor, "sample_tokens")
        where, how = _guard(tree)
        if sample is None and where is None and tree.module_file(RUNNER) is None:
            # The module this check read is deleted and nothing took its place that it can read: not a pass.
            facts.append(Fact(CONTRACT.id, symbol, "protocol", f"not decidable: {how}", None, site=site(call)))
            continue
        evidence = where or (tree.where(sample) if sample is not None else tree.where(ref.obj))
        parked = sample is not None or where is not None
        value = (
            f"execute_model() returns None and parks its state until sample_tokens() ({how})"
            if parked
            else "execute_model() completes the step"
        )
        facts.append(
            Fact(
                CONTRACT.id,
                symbol,
                "protocol",
                value,
                not parked,
                "two-phase-execute",
                evidence,
                site(call),
                {"executor_sample_tokens": sample is not None},
            )
        )
    return facts


CONTRACT = Contract(
    id="twophase",
    assumes="execute_model(scheduler_output) may be called again without sample_tokens()",
    failures=(r"State error: sample_tokens\(\) must be called after execute_model\(\) returns None",),
    shims=(Shim(Attach.STEP, sample_after_step),),
    gate_owns=(("vllm.v1.executor.multiproc_executor:MultiprocExecutor", "().execute_model"),),
    gate_covers=(
        GateCover(
            "two-phase-execute",
            sample_after_step,
            "calls sample_tokens(None) after an execute_model() that returned None, as EngineCore does",
            lambda f: bool(f.detail.get("executor_sample_tokens")),
            "the executor has sample_tokens",
        ),
    ),
    gate_checks=(two_phase,),
    upstream=(
        "vLLM #26866 (async scheduling + structured outputs) made execute_model() return None and park "
        "its state until sample_tokens() (0.11.1)"
    ),
)
