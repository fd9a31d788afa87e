"""Throughput of extraction (speculators' generator through the shims) against plain vLLM prefill, paired.

Both engines are started once, on the same model and prompts, with the same dtype and scheduler limits
(speculators': 32 sequences, max(8192, max_model_len) tokens a step, eager, prefix caching off). After a
warm-up call each they are timed in interleaved pairs, the order alternating (A B, B A, A B, ...) so that a
drift of the machine (another process, clocks, caches) hits both sides alike. Each pair gives one ratio,
plain seconds over extraction seconds (= extraction tokens/s over prefill tokens/s); the result is the
median ratio with its min and max, and a verdict against the goal (extraction >= 0.9 x plain prefill).
The verdict is the benchmark's own output, never a test assertion: speed is measured, not asserted.
`python -m harness bench` and `benchmarks/extraction_vs_prefill.py` run it on CPU builds; the GPU benchmark
(`benchmarks/gpu_extraction_profile.py`) uses the same `paired`.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path

from harness.subjects.prompts import random_prompts
from harness.support.paths import REPORTS

#: Extraction should cost no more than a tenth of plain prefill's throughput.
GOAL = 0.9
#: speculators 0.3.0's scheduler limits (vllm_hidden_states_generator.py), which plain vLLM is given too.
MAX_NUM_SEQS = 32
MIN_BATCHED_TOKENS = 8192


def prompts(vocab: int) -> list[list[int]]:
    """The benchmark's batch: 48 prompts of 64..256 tokens (7,606 tokens at the tiny models' vocabulary)."""
    return random_prompts(48, 64, 256, vocab, seed=7)


def spread(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "all": list(times)}


def paired(plain, extract, pairs: int = 5, warmup: int = 1) -> dict:
    """Time `plain()` and `extract()` in `pairs` interleaved rounds after `warmup` calls of each.

    Returns seconds per side and the per-pair ratio plain/extract, each as median/min/max/all."""
    if pairs < 1:
        raise ValueError("pairs must be at least 1")
    for _ in range(warmup):
        plain()
        extract()
    t_plain: list[float] = []
    t_extract: list[float] = []
    for i in range(pairs):
        order = ((plain, t_plain), (extract, t_extract))
        for fn, into in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fn()
            into.append(time.perf_counter() - t0)
    ratios = [p / e for p, e in zip(t_plain, t_extract, strict=True)]
    return {
        "pairs": pairs,
        "warmup": warmup,
        "plain_s": spread(t_plain),
        "extract_s": spread(t_extract),
        "ratio": spread(ratios),
    }


def timed(fn, calls: int, warmup: int = 1) -> list[float]:
    """Seconds of `calls` calls of `fn` after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def unpaired(plain_s: list[float], extract_s: list[float]) -> dict:
    """`paired`'s result for sides timed one after the other (the engines do not fit side by side): the ratio of
    the medians, its min and max the extremes of any pairing (slowest plain over fastest extraction and back)."""
    ratio = spread([statistics.median(plain_s) / statistics.median(extract_s)])
    ratio.update(min=min(plain_s) / max(extract_s), max=max(plain_s) / min(extract_s))
    return {"pairs": len(plain_s), "plain_s": spread(plain_s), "extract_s": spread(extract_s), "ratio": ratio}


def verdict(ratio: dict, goal: float = GOAL) -> str:
    """One line: the median ratio with its spread, against the goal."""
    met = "meets" if ratio["median"] >= goal else "below"
    return (
        f"extraction at {ratio['median']:.2f}x plain prefill (median of {len(ratio['all'])} pairs, "
        f"min {ratio['min']:.2f}, max {ratio['max']:.2f}): {met} the goal of {goal}x"
    )


def plain_llm(path, dtype: str, max_model_len: int, **kwargs):
    """Plain vLLM with speculators' limits, for the baseline (the caller shuts it down: `shutdown`)."""
    from vllm import LLM

    return LLM(
        model=str(path),
        dtype=dtype,
        max_model_len=max_model_len,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=max(MIN_BATCHED_TOKENS, max_model_len),
        seed=0,
        **kwargs,
    )


def plain_engine(
    path,
    dtype: str,
    max_model_len: int,
    *,
    language_model_only: bool = False,
    attention_backend: str | None = None,
    **kwargs,
):
    """`plain_llm` run as the harness runs the same checkpoint: its text model only where the generator is told so
    (a multimodal checkpoint such as Kimi-K2.5), the attention backend asked for, remote code trusted."""
    from vllm import EngineArgs

    from harness.runtime.generator import attention_backend_kwargs, text_only_kwargs
    from harness.runtime.inputs import load_format_of

    if load_format_of(path):
        kwargs.setdefault("load_format", load_format_of(path))
    if language_model_only:
        kwargs.update(text_only_kwargs(EngineArgs))
    if attention_backend:
        kwargs.update(attention_backend_kwargs(attention_backend))
    return plain_llm(path, dtype, max_model_len, trust_remote_code=True, **kwargs)


def prefill_call(llm, batch):
    """A callable that prefills `batch` with plain vLLM (`LLM.generate(max_tokens=1)`, greedy)."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=1, temperature=0.0)
    requests = [{"prompt_token_ids": p} for p in batch]
    return lambda: llm.generate(requests, sp, use_tqdm=False)


def shutdown(llm) -> None:
    """Stop an `LLM`'s engine core and its workers now (no process may outlive the caller's use of it): the
    engine core client's `shutdown` where there is one, else the engine's. Errors while shutting down are
    swallowed (shutting down must go on); the objects are dropped and collected."""
    import gc

    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    for target in (core, engine):
        fn = getattr(target, "shutdown", None)
        if callable(fn):
            with contextlib.suppress(Exception):  # shutting down must go on
                fn()
            break
    del engine, core
    gc.collect()


def run(model_name: str = "tiny-llama", pairs: int = 5, dtype: str = "float32", max_model_len: int = 512) -> dict:
    from harness.contracts import mla
    from harness.runtime.generator import HarnessGenerator, options_for
    from harness.subjects import models

    started = time.perf_counter()
    model = models.build(model_name)
    mla.prepare(model)
    batch = prompts(vocab=model.vocab_size)
    tokens = sum(map(len, batch))
    with HarnessGenerator(model.path, [1], max_model_len=max_model_len, options=options_for(model, dtype=dtype)) as gen:
        llm = plain_llm(model.path, dtype, max_model_len, gpu_memory_utilization=0.8)
        try:
            result = paired(prefill_call(llm, batch), lambda: gen.generate(batch), pairs=pairs)
        finally:
            shutdown(llm)
    ratio = result["ratio"]
    return {
        "model": model_name,
        "dtype": dtype,
        "prompts": len(batch),
        "tokens": tokens,
        **result,
        "ratio_median": ratio["median"],
        "ratio_min": ratio["min"],
        "ratio_max": ratio["max"],
        "extract_tokens_per_s": tokens / result["extract_s"]["median"],
        "prefill_tokens_per_s": tokens / result["plain_s"]["median"],
        "goal": GOAL,
        "meets_goal": ratio["median"] >= GOAL,
        "verdict": verdict(ratio),
        "wall_s": round(time.perf_counter() - started, 1),
        "note": "paired A/B (order alternating) after a warm-up; LLM.generate(max_tokens=1), prefix caching "
        "off, speculators' scheduler limits (32 seqs, 8192 tokens a step), eager; both engines alive",
    }


def write(env: str, result: dict, report_dir: Path = REPORTS) -> Path:
    from harness.support.report_files import write_atomic

    path = Path(report_dir) / f"{env}.bench.json"
    write_atomic(path, json.dumps(result, indent=2) + "\n")
    return path
