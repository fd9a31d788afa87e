"""`patched_generator()`: speculators 0.3.0's `VllmHiddenStatesGenerator` through the harness's shims.

The class that runs is speculators' own, rebound (see `namespace.rebind`) so that the vLLM names it
looks up resolve to the shims that the installed vLLM needs. Which shims those are is decided by
probing the installed vLLM (signatures, defaults, an echo RPC, the loaded model), never by its
version string. Around it the harness adds what a user can rely on:

* input checks with clear errors (missing model, bad layer ids, empty batch, token ids outside the
  vocabulary, fewer GPUs than the tensor-parallel size);
* over-long prompts are truncated as speculators does, but reported (warning + `truncated_from`);
* every call's result is checked row for row against its token counts (`IncompleteExtraction`);
* RPC timeouts (a hung worker becomes `WorkerTimeout`), and an executor that is always shut down:
  on `close()`, on `with` exit, when construction fails half-way, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import contracts
from harness.contracts import chunkedprefill
from harness.contracts.base import Attach
from harness.runtime import cpu_ranks, devices, fast_path, transport, zmq_contexts
from harness.runtime.batch_invariant_norm import engage_all, mode_env
from harness.runtime.executor_view import ExecutorView
from harness.runtime.inputs import (  # HarnessInputError: what a refused start raises, importable from here too
    HarnessInputError,  # noqa: F401
    check_weights,
    checked_layer_ids,
    checked_prompts,
    load_format_of,
    read_model_config,
    text_config,
)
from harness.support.namespace import rebind

WORKER_EXTENSION = "harness.runtime.worker.HarnessWorkerExtension"
DEFAULT_RPC_TIMEOUT_S = float(os.environ.get("HARNESS_RPC_TIMEOUT_S", "600"))


class IncompleteExtraction(RuntimeError):
    """A result has fewer (or more) hidden-state rows than its prompt has tokens."""


class ExtractionRefused(RuntimeError):
    """The generator refuses to extract: speculators' replacement forward does not compute this model's own layer
    outputs (C-forward's comparison, run at start for a stack C-eagle3's shim admitted)."""


@dataclass
class ShimState:
    """What the shims need to know about the generator they serve, filled in as it is built."""

    vllm_config: Any = None
    executors: list = field(default_factory=list)
    disabled: frozenset = frozenset()
    rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S
    #: zmq contexts created while the executor was built (see `zmq_contexts`), destroyed at shutdown.
    zmq_contexts: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    #: vLLM's worker-monitor threads of those executors, joined before the contexts are destroyed.
    monitors: list = field(default_factory=list)
    #: Objects one contract's shims share across attach points, by contract id (e.g. C-chunkedprefill's guard).
    per_contract: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Options:
    """Run options that are not shims: they change what is run, for every vLLM alike."""

    dtype: str | None = None  # None: speculators' "auto"
    async_scheduling: bool | None = None  # None: vLLM decides
    #: Multimodal targets (Kimi-K2.5): build the language model only. Extraction is text-only, and the
    #: vision tower's processor is remote code that a text-only run need not load.
    language_model_only: bool = False
    #: Attention backend name (e.g. TRITON_ATTN, TRITON_MLA), where the platform's default cannot run.
    attention_backend: str | None = None
    #: vLLM's load format, where the checkpoint folder names one (harness.runtime.inputs.load_format_of).
    load_format: str | None = None
    #: Where the results' hidden states are: "host" (CPU memory, as speculators returns them) or "device" (the GPU
    #: the target runs on, for a consumer that trains there: no host copy; with `fast=True`, since speculators' own
    #: loop copies each prompt's rows to the host itself; harness.runtime.device_hand_off).
    states_on: str = "host"
    #: vLLM's enforce_eager: no torch.compile and no CUDA graphs (what batch-invariant extraction is measured with
    #: besides vLLM's default; benchmarks/gpu_batch_invariance.py).
    enforce_eager: bool = False
    #: A prompt's states independent of the rest of its batch: vLLM's batch-invariant mode for the engine's workers
    #: and the harness's residual norm in place of that mode's batch-dependent one (harness.runtime.
    #: batch_invariant_norm). CUDA only; the start fails where a worker ends up without either.
    batch_invariant: bool = False


def options_for(model, **overrides) -> Options:
    """The Options a tiny model's fixture asks for (`run_options`), with `overrides` on top."""
    return Options(**{**(model.run_options or {}), **overrides})


def _speculators_module():
    for _, shim in contracts.selected(Attach.IMPORT):  # process-wide: no proof runs these in-process
        shim.fn()
    import speculators.data_generation.vllm_hidden_states_generator as module

    return module


def overrides(state: ShimState, options: Options = Options(), ranks: cpu_ranks.Ranks | None = None) -> dict[str, Any]:
    """The names speculators' generator module will see instead of its own globals."""
    module = _speculators_module()
    ns: dict[str, Any] = {}

    def current(name: str) -> Any:
        return ns.get(name, getattr(module, name))

    for _, shim in contracts.selected(Attach.GENERATOR, state.disabled):
        shim.fn(ns, current, state)

    # Infrastructure (not shims): our worker extension, the executor view, config capture, options.
    real_parallel, real_vllm_config = current("ParallelConfig"), current("VllmConfig")
    real_model_config, real_sched_config = current("ModelConfig"), current("SchedulerConfig")
    real_executor_cls = current("MultiprocExecutor")
    real_cache_config = current("CacheConfig")

    def ParallelConfig(**kwargs):  # noqa: N802
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
        return real_parallel(**kwargs)

    def VllmConfig(**kwargs):  # noqa: N802
        if options.attention_backend:
            kwargs.update(attention_backend_kwargs(options.attention_backend))
        if options.load_format:
            from vllm.config import LoadConfig

            kwargs["load_config"] = LoadConfig(load_format=options.load_format)
        cfg = real_vllm_config(**kwargs)
        state.vllm_config = cfg
        return cfg

    def ModelConfig(**kwargs):  # noqa: N802
        if options.dtype:
            kwargs["dtype"] = options.dtype
        if options.language_model_only:
            kwargs.update(text_only_kwargs(real_model_config))
        if options.enforce_eager:
            kwargs["enforce_eager"] = True
        return real_model_config(**kwargs)

    def CacheConfig(**kwargs):  # noqa: N802
        kwargs.update(cpu_ranks.cache_kwargs(ranks, real_cache_config))  # N CPU ranks' swap space, where needed
        return real_cache_config(**kwargs)

    def SchedulerConfig(**kwargs):  # noqa: N802
        if options.async_scheduling is not None:
            kwargs["async_scheduling"] = options.async_scheduling
        return real_sched_config(**kwargs)

    def MultiprocExecutor(vllm_config):  # noqa: N802
        real = real_executor_cls(vllm_config=vllm_config)
        state.executors.append(real)
        view = ExecutorView(real, state, rpc_timeout_s=state.rpc_timeout_s)
        state.executors[-1] = view
        view.collective_rpc("_harness_configure", args=(sorted(state.disabled),))
        for _, shim in contracts.selected(Attach.EXECUTOR, state.disabled):
            shim.fn(view, state)
        return view

    real_tokenizer = current("AutoTokenizer")

    class AutoTokenizer:  # noqa: N801
        """speculators trusts remote code for AutoConfig and vLLM but not here; Kimi-K2.5's tokenizer is remote code."""

        @staticmethod
        def from_pretrained(path, **kwargs):
            kwargs.setdefault("trust_remote_code", True)
            return real_tokenizer.from_pretrained(path, **kwargs)

    ns.update(
        ParallelConfig=ParallelConfig,
        VllmConfig=VllmConfig,
        ModelConfig=ModelConfig,
        CacheConfig=CacheConfig,
        SchedulerConfig=SchedulerConfig,
        MultiprocExecutor=MultiprocExecutor,
        AutoTokenizer=AutoTokenizer,
    )
    return ns


def text_only_kwargs(model_config_cls) -> dict:
    """ModelConfig keywords that skip a multimodal model's encoders, in the form this vLLM takes."""
    import inspect

    params = inspect.signature(model_config_cls).parameters
    if "language_model_only" in params:
        return {"language_model_only": True}
    return {"limit_mm_per_prompt": {"image": 0, "video": 0, "vision_chunk": 0}}


def attention_backend_kwargs(name: str) -> dict:
    """VllmConfig keywords choosing the attention backend (0.20: AttentionConfig; before: an env var)."""
    try:
        from vllm.config import AttentionConfig
    except ImportError:
        os.environ["VLLM_ATTENTION_BACKEND"] = name
        return {}
    return {"attention_config": AttentionConfig(backend=name)}


def generator_class(state: ShimState, options: Options = Options(), ranks: cpu_ranks.Ranks | None = None) -> type:
    module = _speculators_module()
    ns = overrides(state, options, ranks)
    return rebind(module.VllmHiddenStatesGenerator, ns, name="ShimmedVllmHiddenStatesGenerator")


def _shutdown_all(state: ShimState) -> None:
    for ex in state.executors:
        with contextlib.suppress(Exception):  # best effort at exit; the next one must still run
            ex.shutdown()
    zmq_contexts.join(state.monitors)  # none may still be closing its sockets when the contexts go
    zmq_contexts.destroy(state.zmq_contexts)  # after a failed start too: they must never reach the collector


#: Seconds each HarnessGenerator of this process took to start (the env report's time profile reads it).
START_SECONDS: list[float] = []


class HarnessGenerator:
    """speculators' generator, shimmed for the installed vLLM, with checks and a guaranteed shutdown."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        layer_ids: list[int] | None = None,
        *,
        max_model_len: int = 2048,
        gpu_memory_utilization: float = 0.8,
        tensor_parallel_size: int = 1,
        disable: set[str] | frozenset = frozenset(),
        options: Options = Options(),
        rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
    ):
        cfg = text_config(read_model_config(model_path))
        self.num_layers = int(cfg["num_hidden_layers"])
        self.vocab_size = int(cfg["vocab_size"])
        self.hidden_size = int(cfg["hidden_size"])
        layer_ids = checked_layer_ids(layer_ids, self.num_layers)
        check_weights(model_path)
        if options.load_format is None and load_format_of(model_path):
            options = dataclasses.replace(options, load_format=load_format_of(model_path))
        ranks = devices.checked(tensor_parallel_size, options.states_on, options.batch_invariant)
        self.state = ShimState(disabled=frozenset(disable), rpc_timeout_s=rpc_timeout_s)
        self._finalizer = weakref.finalize(self, _shutdown_all, self.state)
        atexit.register(self._finalizer)
        cls = generator_class(self.state, options, ranks)
        started = time.perf_counter()
        try:
            with (
                zmq_contexts.track(self.state.zmq_contexts, self.state.monitors),
                mode_env(options.batch_invariant),
                cpu_ranks.binding_set(ranks),
            ):
                self.spec = cls(str(model_path), layer_ids, max_model_len, gpu_memory_utilization, tensor_parallel_size)
        except BaseException:
            self.close()
            raise
        finally:
            START_SECONDS.append(time.perf_counter() - started)
        self.layer_ids = list(self.spec.layer_ids)
        self.max_model_len = int(self.spec.vllm_config.model_config.max_model_len)
        self.copy_out = transport.CopyOut(workers=tensor_parallel_size)  # speculators' per-prompt copies
        self.fast_views = fast_path.Views()  # what the last fast call handed out (see harness.runtime.fast_path)
        self.steps_ahead = 0  # steps the fast path scheduled while the previous one ran, over all calls
        try:
            #: Why every extraction is refused (a contract's admission check at start), or None.
            self.refused = contracts.refusal(self)
            if options.states_on == "device":  # then every worker's hand-off goes into its own GPU
                self.executor_view.collective_rpc("_harness_set_transport", args=("device",))
            #: Per worker, what `Options(batch_invariant=True)` found and engaged (harness.runtime.batch_invariant_norm).
            self.batch_invariance = engage_all(self.real_executor) if options.batch_invariant else None
        except BaseException:
            self.close()
            raise

    # -- the objects the contracts probe ----------------------------------------------------------
    @property
    def executor_view(self) -> ExecutorView:
        return self.spec.executor

    @property
    def real_executor(self):
        return self.spec.executor.real

    @property
    def scheduler(self):
        return self.spec.scheduler

    @property
    def vllm_config(self):
        return self.spec.vllm_config

    def engaged_shims(self) -> dict[str, Any]:
        worker = self.real_executor.collective_rpc("_harness_engaged_shims")[0]
        return {**worker, **{k: v for k, v in self.executor_view.engaged.items()}}

    # -- extraction -------------------------------------------------------------------------------
    def generate(self, token_ids: list[list[int]], *, fast: bool = False) -> list[dict]:
        """speculators' `generate` (default), or with `fast=True` the harness's fast path over the same scheduler,
        requests and capture: the next step scheduled while the worker runs the current one, and the hidden states
        handed out as views of the hand-off buffer (bitwise the same values; see `harness.runtime.fast_path`)."""
        if self.refused:
            raise ExtractionRefused(self.refused)
        return self.extract(token_ids, fast=fast)

    def extract(self, token_ids: list[list[int]], *, fast: bool = False) -> list[dict]:
        """`generate` without the admission check's refusal (the check itself extracts through here)."""
        prompts = checked_prompts(token_ids, self.vocab_size, self.max_model_len)
        limit = self.max_model_len - 1
        self.fast_views.detach_views()  # the buffer is about to be written: held views of the last call move out
        if fast:
            results, ahead = fast_path.generate(self.spec, prompts)
            self.steps_ahead += ahead
            self.fast_views.track(results)
        else:
            with self.copy_out():
                results = self.spec.generate(prompts)
        # speculators captures each distinct layer once, in stack order (a set in the worker); give the
        # user one tensor per requested id, in the order requested.
        order = sorted(set(self.layer_ids))
        for prompt, result in zip(prompts, results, strict=True):
            n = min(len(prompt), limit)
            captured = result["hidden_states"]
            if len(captured) != len(order):
                raise IncompleteExtraction(f"captured {len(captured)} layers, expected {len(order)} ({order})")
            result["hidden_states"] = [captured[order.index(k)] for k in self.layer_ids]
            rows = [int(h.shape[0]) for h in result["hidden_states"]]
            if any(r != n for r in rows):
                why = chunkedprefill.cause(self.vllm_config.scheduler_config, [min(len(p), limit) for p in prompts])
                raise IncompleteExtraction(
                    f"request of {n} tokens came back with {rows} rows per layer: "
                    + (why or "cause unknown (prefix caching? reordering?)")
                )
            if len(prompt) > limit:
                result["truncated_from"] = len(prompt)
        return results

    # -- lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> HarnessGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def patched_generator(model_path, layer_ids=None, **kwargs) -> HarnessGenerator:
    """The one entry point: speculators' generator for `model_path`, made to work on the installed vLLM.

    It makes the choices the suites make before a start: where the platform cannot run the checkpoint's MLA
    (CPU builds up to 0.28), MLA is turned off for this process (C-mla, `VLLM_MLA_DISABLE=1`, inherited by every
    executor started afterwards), as the conformance run does for its tiny DeepSeek and Kimi models; without
    `options`, a multimodal checkpoint (text and vision configs: Kimi-K2.5) runs its language model only."""
    import dataclasses
    from types import SimpleNamespace

    from harness.contracts import mla

    hf = read_model_config(model_path)  # a bad path is one clear line before anything else
    if kwargs.get("options") is None:  # a multimodal checkpoint (Kimi-K2.5): its language model, as the suites run it
        kwargs["options"] = Options(language_model_only="text_config" in hf and "vision_config" in hf)
    path = Path(model_path).resolve()
    checkpoint = SimpleNamespace(name=str(path), path=path, text_config=text_config(hf))
    mla.prepare(checkpoint, kwargs["options"].attention_backend, dataclasses.asdict(kwargs["options"]))
    return HarnessGenerator(model_path, layer_ids, **kwargs)
