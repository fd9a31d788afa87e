"""C-forward: speculators' replacement forward computes what the model's own forward computes.

speculators 0.3.0 replaces the decoder stack's forward with its own loop: embed the tokens with
`get_input_embeddings`, call each layer with (hidden_states, positions, residual), capture
`hidden_states + residual` after the wanted layers, apply the final norm. A model whose own forward does
anything else on that path gives other states through speculators' loop than through its own, and nothing raises:
the extracted states are silently not the model's. Two kinds are known: Gemma-2 on vLLM <= 0.17 multiplies the
embeddings by sqrt(hidden_size) in its forward, after `embed_input_ids`; Cohere's layer adds its residual inside and
returns (output, input), so `hidden_states + residual` is the output plus the layer's input. No other contract sees
it, and C-eagle3's shim (which admits stacks that vLLM does not mark SupportsEagle3) would let such a model through.

The probe decides it on the running engine, with no knowledge of any model and no transformers: the same prompt
is extracted twice by the same generator, once with the stack's own class forward running and once through
speculators' replacement. In the own pass nothing is summed by the harness: hooks on the model's own modules record
what the model itself feeds on after each captured layer (the next layer's input, or the tensor its normalisation
normalises, told by running that normalisation again: harness.subjects.own_stream), and hand it over in
speculators' place. A reference that formed speculators' sum would agree with speculators on every model. Each pass
is an ordinary step of its own, one forward per step, so neither can disturb the other (a step that ran two
forwards over one set of KV slots and attention metadata gave garbage on a cold MoE model); prefix caching is off in
speculators' generator (C-prefixcache), and the prefix cache is emptied before each pass where it is on, so both
passes compute every row.

The bound: the same kernels on the same inputs and shapes give the same bits; where a platform reorders a reduction
between two calls, the difference stays within a few units in the last place of the states' magnitude. So a layer
holds when max|own - speculators'| <= ULPS * eps(dtype) * max(1, max|own|) (float32: 4 x 1.19e-7 x the magnitude).
Gemma-2's skipped scale moves the states by their own size.

No shim: the loop is speculators' code, so a divergence is speculators' fault. The generator runs this check on
every stack speculators' loop replaced (`admission`, once its workers are set up, through C-eagle3): on a divergence
every extraction is refused with the measurement and what differs, so wrong states never reach a user. speculators 0.4.0 dropped its
replacement loop for vLLM's own aux-hidden-state path.
"""

from __future__ import annotations

from harness.contracts.base import NOT_OBSERVED, Attempt, Contract, Observation

#: Units in the last place of the states' magnitude two passes over the same prompt may differ by.
ULPS = 4
FAILURE = "ForwardDivergence"
#: One prompt per comparison, each within one step: short, and one crossing KV blocks.
PROMPT_TOKENS = (24, 61)


# -- in the worker: the own pass ---------------------------------------------------------------------
def stack_of(worker):
    from harness.contracts.kimistack import decoder_stack

    return decoder_stack(worker.model_runner.model)


def captures_here() -> bool:
    """Whether this worker captures: speculators captures on tensor-parallel rank 0 only."""
    from vllm.distributed import get_tp_group

    return get_tp_group().rank_in_group == 0


class OwnPass:
    """While installed, the stack runs its own class forward; hooks on its own modules record what the model feeds
    on after each captured layer (harness.subjects.own_stream) and hand it to speculators' store, so an extraction
    returns the own forward's states."""

    def __init__(self, worker):
        from harness.subjects.own_stream import Recorder

        self.worker = worker
        self.stack = stack_of(worker)
        self.replacement = self.stack.__dict__.get("forward")  # speculators' bound loop, installed by its set-up
        self.ids = sorted(worker._layer_ids)
        self.recorder = Recorder(self.stack, self.ids)
        self.told: dict = {}
        self.stack.forward = self.forward

    def forward(self, *args, **kwargs):
        self.recorder.reset()
        out = type(self.stack).forward(self.stack, *args, **kwargs)
        if captures_here():
            states, self.told = self.recorder.states()
            self.worker._store_captured_states(states)
        self.recorder.reset()
        return out

    def remove(self) -> dict:
        self.recorder.remove()
        if self.replacement is None:
            self.stack.__dict__.pop("forward", None)
        else:
            self.stack.forward = self.replacement
        return self.told


def own_pass(worker, on: bool) -> dict:
    """Install (on) or remove (off) the own pass on this worker; what runs where, and (off) how the state after
    each captured layer was told (`feeds_on`)."""
    current = worker.__dict__.get("_harness_own_pass")
    told: dict = {}
    if current is not None:
        told = current.remove()
        worker._harness_own_pass = None
    if on:
        worker._harness_own_pass = OwnPass(worker)
    stack = stack_of(worker)
    own = type(stack).forward
    where = {"stack": type(stack).__name__, "own_forward": f"{own.__module__}.{own.__qualname__}"}
    return {**where, "feeds_on": {str(k): v for k, v in told.items()}} if not on else where


class EntryTrace:
    """Records what the first layer is fed (its hidden-states input) in whichever forward runs: the step between
    the embedding and the layers is where a replacement loop most often departs from a model's own forward."""

    def __init__(self, worker):
        stack = stack_of(worker)
        first = list(stack.layers)[getattr(stack, "start_layer", 0)]
        self.seen = None
        self._hook = first.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        import torch

        fed = kwargs.get("hidden_states")
        if fed is None:  # positional: (positions, hidden_states, ...); positions are integers
            fed = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        if fed is not None and captures_here():
            self.seen = fed.detach().to("cpu", copy=True)

    def remove(self) -> None:
        self._hook.remove()


def entry_trace(worker, on: bool):
    """Install (on) or remove (off) the entry trace; off returns what the first layer was last fed (rank 0)."""
    current = worker.__dict__.get("_harness_entry_trace")
    seen = None
    if current is not None:
        current.remove()
        seen = current.seen
        worker._harness_entry_trace = None
    if on:
        worker._harness_entry_trace = EntryTrace(worker)
    return seen


# -- in the driver: the comparison -------------------------------------------------------------------
def judge(own: list, spec: list, layer_ids: list[int]) -> dict:
    """The worst layer of two extractions of one prompt (lists of per-layer tensors, in `layer_ids` order)."""
    import torch

    worst: dict = {"held": True, "ratio": 0.0}
    for k, a, b in zip(layer_ids, own, spec, strict=True):
        if a.shape != b.shape:
            return {
                "held": False,
                "layer": k,
                "ratio": float("inf"),
                "why": f"layer {k}: shapes {tuple(a.shape)} (own) and {tuple(b.shape)} (speculators')",
            }
        x, y = a.float(), b.float()
        diff = float((x - y).abs().max()) if x.numel() else 0.0
        magnitude = float(x.abs().max()) if x.numel() else 0.0
        bound = ULPS * float(torch.finfo(a.dtype).eps) * max(magnitude, 1.0)
        ratio = diff / bound
        if ratio >= worst["ratio"]:
            worst = {
                "held": diff <= bound,
                "layer": k,
                "ratio": ratio,
                "max_abs_diff": diff,
                "bound": bound,
                "magnitude": magnitude,
                "dtype": str(a.dtype).replace("torch.", ""),
                "rows": int(a.shape[0]),
            }
    return worst


def entry_step(own, spec) -> str | None:
    """Where the two forwards part, if already before the first layer: what the own forward does to the embeddings
    that speculators' loop does not (a uniform scale is named with its factor)."""
    import torch

    if own is None or spec is None:
        return None
    if own.shape != spec.shape:
        return f"the first layer is fed {tuple(own.shape)} by the own forward, {tuple(spec.shape)} by speculators' loop"
    x, y = own.float(), spec.float()
    bound = ULPS * float(torch.finfo(own.dtype).eps) * max(float(x.abs().max()), 1.0)
    if float((x - y).abs().max()) <= bound:
        return None
    scale = float((x * y).sum() / (y * y).sum()) if float((y * y).sum()) else float("nan")
    if float((x - scale * y).abs().max()) <= bound * max(abs(scale), 1.0):
        return (
            f"its own forward scales the embeddings by {scale:.4g} before the first layer; speculators' loop does not"
        )
    return "its own forward changes the embeddings before the first layer in a way speculators' loop does not"


def describe(result: dict, stack: str) -> str:
    if "why" in result:
        return f"speculators' replacement forward and {stack}.forward disagree: {result['why']}"
    step = result.get("entry_step") or _at_layer(result)
    return (
        f"speculators' replacement forward differs from {stack}.forward by {result['max_abs_diff']:.3g} at layer "
        f"{result['layer']} (states up to {result['magnitude']:.3g}, bound {result['bound']:.3g} = {ULPS} ulp of "
        f"{result['dtype']}): {step}"
    )


def _at_layer(result: dict) -> str:
    """What differs at the layer where the two forwards part, from what the own pass told of the model's state."""
    feeds_on = result.get("feeds_on")
    if feeds_on and "alone" in feeds_on:
        return f"{feeds_on}, while speculators' loop captures hidden_states + residual after layer {result['layer']}"
    return f"speculators' loop computes layer {result['layer']}'s state otherwise than the model's own forward" + (
        f" ({feeds_on})" if feeds_on else ""
    )


def _no_cached_prefix(generator) -> None:
    """Both passes compute every row of the prompt: where prefix caching is on (a shim proof that leaves
    C-prefixcache's shim out), the cache the first pass filled is emptied before the next."""
    reset = getattr(generator.scheduler, "reset_prefix_cache", None)
    if reset is not None:
        reset()


def compare(generator, prompt: list[int]) -> tuple[dict, dict]:
    """Extract `prompt` through the stack's own forward, then through speculators' loop; (worst layer, where)."""
    call = generator.executor_view.real.collective_rpc
    where = call("_harness_call", args=(own_pass, True))[0]
    try:
        call("_harness_call", args=(entry_trace, True))
        _no_cached_prefix(generator)
        own = generator.extract([prompt])
    finally:
        told = call("_harness_call", args=(own_pass, False))[0]["feeds_on"]
        fed_own = call("_harness_call", args=(entry_trace, False))[0]
    try:
        call("_harness_call", args=(entry_trace, True))
        _no_cached_prefix(generator)
        spec = generator.extract([prompt])
    finally:
        fed_spec = call("_harness_call", args=(entry_trace, False))[0]
    result = judge(own[0]["hidden_states"], spec[0]["hidden_states"], generator.layer_ids)
    if not result["held"]:
        result["entry_step"] = entry_step(fed_own, fed_spec)
        result["feeds_on"] = told.get(str(result.get("layer")))
    return result, {**where, "feeds_on": told}


def checked(generator, prompts) -> tuple[dict, dict]:
    """The worst result over `prompts`, and the stack's names."""
    results: list = []
    where: dict = {}
    for p in prompts:
        result, where = compare(generator, p)
        results.append(result)
    bad = [r for r in results if not r["held"]]
    return (bad[0] if bad else max(results, key=lambda r: r["ratio"])), {**where, "checks": results}


def admission(generator, prompts) -> str | None:
    """Why speculators' loop may not hand over this model's states (its divergence from the own forward), or None."""
    worst, where = checked(generator, prompts)
    return None if worst["held"] else f"{FAILURE}: refusing to hand over states: {describe(worst, where['stack'])}"


# -- the probe ---------------------------------------------------------------------------------------
def probe(ctx) -> Observation:
    prompts = [ctx.prompt(n, seed=seed + 11) for seed, n in enumerate(PROMPT_TOKENS)]
    ran, compared = Attempt.run(lambda: checked(ctx.generator, prompts))
    facts = {"layers": ctx.layer_ids, "bound": f"{ULPS} ulp of the states' magnitude"}
    if not ran.ok:
        attempt = Attempt.failed(NOT_OBSERVED, f"the two extractions did not run: {ran.text}")
        return Observation(CONTRACT, attempt, None, facts, subject=ctx.model.subject)
    worst, where = compared
    facts.update(where)
    attempt = Attempt(True) if worst["held"] else Attempt.failed(FAILURE, describe(worst, where["stack"]))
    return Observation(CONTRACT, attempt, None, facts, subject=ctx.model.subject)


CONTRACT = Contract(
    id="forward",
    assumes="speculators' replacement forward (embed -> layers -> norm) computes the model's own forward's layer outputs",
    failures=(rf"{FAILURE}: ",),
    side="worker",
    native_says="speculators' replacement forward gives the model's own layer outputs (bitwise or within the bound)",
    broken_says="speculators' fault: its replacement forward does not give this model's own states",
    gate_outside="the equivalence of two forwards is observed by running both on the engine; sources cannot decide it",
    upstream=(
        "not a vLLM change: speculators 0.3.0's replacement loop (custom_worker._patched_forward) assumes "
        "every stack is embed -> layers -> norm; Gemma2Model.forward scaled the embeddings by sqrt(hidden_size) "
        "after embed_input_ids from the model's addition (vllm-project/vllm#5908) until vLLM 0.18 moved the "
        "scale into embed_input_ids (vllm-project/vllm#36787); CohereDecoderLayer returns (output, input) since "
        "Command-R's addition (vllm-project/vllm#3433)"
    ),
)
