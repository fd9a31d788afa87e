"""Throughput of extraction (speculators' generator through the shims) against plain vLLM prefill.

Same model, same prompts, same dtype, in one run: `LLM.generate(..., SamplingParams(max_tokens=1))`
with prefix caching off (as the shimmed generator runs) is the baseline; the ratio is
extraction tokens/s over prefill tokens/s (goal >= 0.9: the shims must not cost speed). Each side is
timed best-of-N after a warm-up call, wall clock, in this process. `benchmarks/extraction_vs_prefill.py`
and `python -m harness bench` run it; the matrix shows the ratio per version.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

from harness.paths import REPORTS


def prompts(n: int = 48, lo: int = 64, hi: int = 256, vocab: int = 512, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _best(fn, repeats: int) -> tuple[float, list[float]]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def run(model_name: str = "tiny-llama", repeats: int = 3, dtype: str = "float32", max_model_len: int = 512) -> dict:
    from vllm import LLM, SamplingParams

    from harness import models
    from harness.contracts import mla
    from harness.generator import HarnessGenerator, options_for

    model = models.build(model_name)
    mla.prepare(model)
    batch = prompts(vocab=model.vocab_size)
    tokens = sum(map(len, batch))
    with HarnessGenerator(model.path, [1], max_model_len=max_model_len, options=options_for(model, dtype=dtype)) as gen:
        extract_s, extract_all = _best(lambda: gen.generate(batch), repeats)
    llm = LLM(model=str(model.path), dtype=dtype, max_model_len=max_model_len, enforce_eager=True,
              enable_prefix_caching=False, max_num_seqs=32, max_num_batched_tokens=max(8192, max_model_len),
              gpu_memory_utilization=0.8, seed=0)
    try:
        sp = SamplingParams(max_tokens=1, temperature=0.0)
        requests = [{"prompt_token_ids": p} for p in batch]
        prefill_s, prefill_all = _best(lambda: llm.generate(requests, sp, use_tqdm=False), repeats)
    finally:
        _shutdown(llm)
    return {"model": model_name, "dtype": dtype, "prompts": len(batch), "tokens": tokens, "repeats": repeats,
            "extract_s": extract_s, "prefill_s": prefill_s, "extract_tokens_per_s": tokens / extract_s,
            "prefill_tokens_per_s": tokens / prefill_s, "ratio": prefill_s / extract_s,
            "extract_all_s": extract_all, "prefill_all_s": prefill_all,
            "extract_median_s": statistics.median(extract_all), "prefill_median_s": statistics.median(prefill_all),
            "note": "LLM.generate(max_tokens=1), prefix caching off, speculators' scheduler limits (32 seqs, 8192 tokens)"}


def _shutdown(llm) -> None:
    engine = getattr(llm, "llm_engine", None)
    for attr in ("shutdown",):
        fn = getattr(engine, attr, None) or getattr(getattr(engine, "engine_core", None), attr, None)
        if callable(fn):
            fn()
            return


def write(env: str, result: dict, report_dir: Path = REPORTS) -> Path:
    from harness.report import write_atomic

    path = Path(report_dir) / f"{env}.bench.json"
    write_atomic(path, json.dumps(result, indent=2) + "\n")
    return path
