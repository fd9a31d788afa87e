"""One native engine per tiny model, shared by the native suite's tests: started after our own generator, with
one retry without the last layer's output, and always closed on failure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.contracts.base import Attempt
from harness.native.engine import CONNECTOR, METHOD, NativeExporter, NativeExportError, default_gpu_memory_utilization
from harness.native.engine_log import platform_failure
from harness.native.layer_ids import map_layer_ids
from harness.native.probes import availability
from harness.native.rows import NativeProbe
from harness.subjects.prompts import random_prompts

GPU_SHARE = 0.1  # of the card, per native engine on CUDA


def prompts_for(vocab: int) -> list[list[int]]:
    """Six prompts of 17..96 tokens: several KV blocks each, small enough for a 2-core machine."""
    return random_prompts(6, 17, 96, vocab, seed=21)


@dataclass
class NativeRun:
    name: str
    ours: Any  # the shared ModelRun (harness.testing)
    layer_ids: list[int] = field(default_factory=list)  # speculators' ids the native run was asked for
    exporter: NativeExporter | None = None
    first: list | None = None  # the first extraction (the agreement prompts)
    start: Attempt | None = None
    called: str = ""
    skip: str | None = None  # why the native comparison cannot run here
    skip_result: str = "n/a"
    last_layer: NativeProbe | None = None  # native id n (the last layer's output) exported?
    agreement: tuple[float, float, str] | None = None  # (max abs diff, tolerance, what was compared), once

    @property
    def model(self):
        return self.ours.model


def gpu_share() -> float | None:
    """On CUDA a native engine takes a small share of the card (tiny models), so that the shared generator, the
    native engine and the unmapped-ids engine fit side by side; elsewhere vLLM's own default."""
    from vllm.platforms import current_platform

    return default_gpu_memory_utilization(GPU_SHARE) if current_platform.device_type == "cuda" else None


def layers_of(ours) -> list[int]:
    """The shared generator's layers (speculators' convention); both ends where it did not start."""
    if ours.generator is not None:
        return list(ours.generator.layer_ids)
    return [0, ours.model.num_layers - 1]


def start(name: str, ours) -> NativeRun:
    """`ours` (the suite's shared run of the model) first: it made the MLA decision and shows the model runs
    here. Then vLLM's native path, retried once without the last layer's output where a start that worked then
    failed on real requests (some model classes never capture it); the engine is closed on every failure."""
    nr = NativeRun(name, ours)
    if ours.absent:
        nr.skip = ours.absent
        return nr
    ok, why = availability()
    if not ok:
        nr.skip = why
        return nr
    from harness.support.processes import adopt_session_processes

    model = ours.model
    layers = layers_of(ours)
    prompts = prompts_for(model.vocab_size)
    last = model.num_layers - 1
    last_check = f"native id {model.num_layers} (last layer's output, speculators' {last}) exported"
    without_last: NativeExportError | None = None  # the first failure, when the last layer was then dropped
    while True:
        nr.layer_ids = layers
        nr.called = (
            f"LLM({model.architecture}, dtype=float32, speculative_config={{method: {METHOD}, "
            f"eagle_aux_hidden_state_layer_ids: {sorted(set(map_layer_ids(layers, model.num_layers)))}}}, "
            f"kv_connector={CONNECTOR}).generate(max_tokens=1)"
        )
        exporter = None
        try:
            exporter = NativeExporter(model, layers, gpu_memory_utilization=gpu_share())
            first = exporter.extract(prompts)
        except NativeExportError as e:
            if exporter is not None:
                exporter.close()
            attempt = Attempt.failed(type(e.error).__name__, str(e), stage=e.stage, root_cause=e.root_cause)
            if (
                e.stage == "extract"
                and last in layers
                and len(set(layers)) > 1
                and without_last is None
                and not platform_failure(e)
            ):
                # Started, then failed on real requests: try again without the last layer's output, the one id
                # some model classes do not capture (their loop collects inputs of layers 0..n-1 only).
                without_last, first_called = e, nr.called
                layers = [k for k in layers if k != last]
                continue
            if without_last is not None:
                nr.last_layer = last_layer_verdict(last_check, first_called, without_last, e)
            nr.start, nr.skip = attempt, f"the native path does not run here: {e}"
            return nr
        except BaseException:
            if exporter is not None:
                exporter.close()  # whatever went wrong, no engine outlives the failure
            raise
        adopt_session_processes()  # the engine lives for the module: its processes are not a test's leak
        nr.exporter, nr.first, nr.start = exporter, first, Attempt(True)
        if without_last is not None:
            nr.last_layer = last_layer_verdict(last_check, first_called, without_last, None)
        else:
            nr.last_layer = NativeProbe(
                last_check,
                nr.called,
                Attempt(True),
                f"speculators' {last} -> native {model.num_layers} exported"
                if last in layers
                else f"speculators' {last} not requested",
                True if last in layers else None,
            )
        return nr


def last_layer_verdict(
    check: str, called: str, with_last: NativeExportError, without: NativeExportError | None
) -> NativeProbe:
    """Whether the last layer's output is what broke the first run: only if leaving it out changed the outcome."""
    failed = Attempt.failed(type(with_last.error).__name__, str(with_last), root_cause=with_last.root_cause)
    if without is None:
        return NativeProbe(check, called + " (without it the run works)", failed)
    if (without.root_cause or str(without)) == (with_last.root_cause or str(with_last)):
        return NativeProbe(
            check,
            called,
            failed,
            not_applicable=(f"not observable: the native path fails the same way with and without it: {with_last}"),
        )
    return NativeProbe(
        check, called + f" (without it the run gets further, then fails: {without.root_cause or without})", failed
    )
