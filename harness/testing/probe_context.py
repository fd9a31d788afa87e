"""What a probe gets to work with: one model, one shimmed generator on it, and real vLLM objects.

Starting an executor is the expensive part of a probe (a worker process, a model load), so one
`ProbeContext` per model shares one fully shimmed generator; probes build their own Schedulers,
Requests and configs (cheap) around it, and run speculators' own code with one shim left out.
"""

from __future__ import annotations

import itertools
import random
from functools import cached_property
from typing import Any

from harness.installed import surface
from harness.runtime.generator import HarnessGenerator, ShimState, generator_class, options_for
from harness.subjects.models import TinyModel

MAX_MODEL_LEN = 512


class ProbeContext:
    def __init__(self, model: TinyModel, generator: HarnessGenerator, max_model_len: int = MAX_MODEL_LEN):
        self.model = model
        self.generator = generator
        self.max_model_len = max_model_len
        self._ids = itertools.count()
        self._extra: dict[bool, HarnessGenerator | None] = {}
        self._start_failures: dict = {}

    # -- the shared generator's real objects ------------------------------------------------------
    @property
    def vllm_config(self):
        return self.generator.vllm_config

    @property
    def kv_cache_config(self):
        return self.generator.scheduler.kv_cache_config

    @property
    def block_size(self) -> int:
        return int(self.vllm_config.cache_config.block_size)

    @property
    def real_executor(self):
        return self.generator.real_executor

    @property
    def executor_view(self):
        return self.generator.executor_view

    @property
    def world_size(self) -> int:
        return int(self.vllm_config.parallel_config.world_size)

    @property
    def layer_ids(self) -> list[int]:
        return self.generator.layer_ids

    def kv_cache_spec(self) -> dict:
        return self.real_executor.collective_rpc("get_kv_cache_spec")[0]

    def worker_call(self, fn, *args) -> Any:
        """Run `fn(worker, *args)` in every worker; rank 0's answer."""
        return self.real_executor.collective_rpc(fn, args=args)[0]

    # -- speculators' own calls -------------------------------------------------------------------
    @staticmethod
    def keywords(name: str) -> list[str]:
        return surface.speculators_call(name)

    def speculators_vllm_config(self, disable: frozenset[str] | set[str] = frozenset(), **options: Any):
        """The VllmConfig speculators' `_create_vllm_config` builds, with the given shims left out."""
        cls: Any = generator_class(ShimState(disabled=frozenset(disable)), options_for(self.model, **options))
        return cls._create_vllm_config(
            None,
            model_path=str(self.model.path),
            max_model_len=self.max_model_len,
            gpu_memory_utilization=0.8,
            tensor_parallel_size=1,
        )

    @cached_property
    def _eos(self) -> int | None:
        return self.generator.spec.tokenizer.eos_token_id

    def prompt(self, n_tokens: int, seed: int = 0) -> list[int]:
        rng = random.Random(seed * 7919 + n_tokens)
        return [rng.randrange(4, self.model.vocab_size) for _ in range(n_tokens)]

    def request_values(self, prompt: list[int]) -> dict:
        from vllm.sampling_params import SamplingParams

        return {
            "request_id": f"probe-{next(self._ids)}",
            "prompt_token_ids": prompt,
            "sampling_params": SamplingParams(max_tokens=1, temperature=0.0),
            "pooling_params": None,
            "eos_token_id": self._eos,
            "arrival_time": 0.0,
        }

    def new_request(self, vllm_config, prompt: list[int]):
        """A Request as speculators makes it, through the C-request shim (block hasher for this config)."""
        from types import SimpleNamespace

        from vllm.v1.request import Request

        from harness.contracts import request

        ns: dict = {}
        request.apply(ns, lambda name: ns.get(name, Request), SimpleNamespace(vllm_config=vllm_config))
        values = self.request_values(prompt)
        return ns.get("Request", Request)(**{k: values[k] for k in self.keywords("Request")})

    def new_scheduler(self, vllm_config):
        """A Scheduler as speculators makes it, through the C-sched shim, on the shared KV-cache plan."""
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        from harness.contracts import sched

        ns: dict = {}
        sched.apply(ns, lambda name: ns.get(name, Scheduler), None)
        if vllm_config.cache_config.num_gpu_blocks is None:  # speculators sets it from its KV-cache plan
            vllm_config.cache_config.num_gpu_blocks = self.kv_cache_config.num_blocks
        return ns.get("Scheduler", Scheduler)(
            vllm_config=vllm_config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config=vllm_config),
        )

    @staticmethod
    def finished_aborted():
        from vllm.v1.request import RequestStatus

        return RequestStatus.FINISHED_ABORTED

    # -- async-scheduling variants (C-twophase) --------------------------------------------------
    def resolved_async(self, requested: bool) -> bool:
        return bool(self.speculators_vllm_config(async_scheduling=requested).scheduler_config.async_scheduling)

    def generator_for(self, async_scheduling: bool) -> HarnessGenerator | None:
        """A generator whose runner has `async_scheduling` as requested, or None if the platform overrides it."""
        resolved = self.resolved_async(async_scheduling)
        if resolved != async_scheduling:
            return None
        if bool(self.vllm_config.scheduler_config.async_scheduling) == resolved:
            return self.generator
        if self._extra.get(async_scheduling) is None and async_scheduling not in self._start_failures:
            from harness.contracts.base import Attempt

            start, gen = Attempt.run(
                lambda: HarnessGenerator(
                    self.model.path,
                    self.layer_ids,
                    max_model_len=self.max_model_len,
                    options=options_for(self.model, async_scheduling=async_scheduling),
                )
            )
            self._extra[async_scheduling] = gen
            self._start_failures[async_scheduling] = start
        return self._extra[async_scheduling]

    def release(self, gen) -> None:
        """Close a generator started for one probe (its workers must not outlive the test)."""
        for key, value in list(self._extra.items()):
            if value is gen:
                self._extra[key] = None
        gen.close()

    def unobservable_async(self, requested: bool) -> str:
        from vllm.platforms import current_platform

        failed = self._start_failures.get(requested)
        if failed is not None and not failed.ok:
            return (
                f"not observable here: an executor with async_scheduling={requested} does not start on this "
                f"{current_platform.device_type} build ({failed.text})"
            )
        return (
            f"not observable here: async_scheduling={requested} requested, the {current_platform.device_type} "
            f"platform resolves it to {self.resolved_async(requested)}"
        )

    def close(self) -> None:
        for gen in self._extra.values():
            if gen is not None:
                gen.close()
        self._extra.clear()
