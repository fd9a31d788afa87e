"""The GPU tier's shared run: one generator for the configured checkpoint, and its dated report.

Configured by the options and HARNESS_GPU_* variables of harness.testing.plugin (model path,
tensor-parallel size, layer ids, dtype, prompts). Tests add what they measured to `run.facts`; the
finalizer writes `reports/gpu/<date>-<model>-tp<N>-<dtype>.{json,md}` with fingerprints and drift
against the newest earlier report of the same model, TP and dtype.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.testing.gpu import gpu_config


def pytest_collection_modifyitems(config, items):
    """Every GPU test needs `tp` GPUs of one host: say so with a mark (skipped below when fewer)."""
    tp = gpu_config(config).tp
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.multi_gpu(tp))


@dataclass
class TierRun:
    cfg: object
    model_name: str
    text_config: dict
    model: object = None  # harness.subjects.models.TinyModel describing the checkpoint (real or tiny)
    generator: object = None
    mla: object = None  # the C-mla observation made while starting
    prompts: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # what goes into the report (JSON-able)
    batch: list = field(default_factory=list)
    first_batch: list = field(default_factory=list)
    closed: bool = False

    @property
    def language_model_only(self) -> bool:
        """A multimodal checkpoint (Kimi-K2.5) runs its text model only, in the generator and in plain vLLM alike."""
        hf = self.model.hf_config
        return "text_config" in hf and "vision_config" in hf

    @property
    def hidden_size(self) -> int:
        return int(self.text_config["hidden_size"])

    def reference_batch(self) -> list:
        """The batch every comparison is made against: the one test_batch_shapes_dtype_finite extracted, or
        extracted now when that test did not run first (a test run alone still compares something)."""
        if not self.batch:
            self.first_batch = self.generator.generate(self.prompts)
            self.batch = self.generator.generate(self.prompts)
        return self.batch

    def close(self) -> None:
        if not self.closed:
            self.facts["peak_memory_bytes_per_rank"] = self.generator.real_executor.collective_rpc(
                "_harness_peak_memory"
            )
            self.generator.close()
            self.closed = True


def _options(cfg, language_model_only: bool):
    from harness.runtime.generator import Options

    return Options(dtype=cfg.dtype, attention_backend=cfg.attention_backend, language_model_only=language_model_only)


@pytest.fixture(scope="session")
def tier(request):
    from transformers import AutoTokenizer

    from harness.contracts import mla
    from harness.gpu import tier as gpu_tier
    from harness.installed import versions
    from harness.reporting import gpu_report
    from harness.runtime.generator import HarnessGenerator, text_config
    from harness.subjects.models import TinyModel

    cfg = gpu_config(request.config)
    reason = gpu_tier.skip_reason(cfg)
    if reason:
        pytest.skip(reason)
    hf = json.loads((Path(cfg.model_path) / "config.json").read_text())
    run = TierRun(cfg, Path(cfg.model_path).name, text_config(hf))
    tc = run.text_config
    # Any checkpoint runs here, by path: its rows are keyed by its model_type (llama, deepseek_v3, kimi_k25), as the
    # CUDA expectation files name them.
    run.model = TinyModel(run.model_name, Path(cfg.model_path), hf, "", row_key=hf.get("model_type", ""))
    run.facts["family"] = run.model.family
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_path, trust_remote_code=True)
    run.prompts = gpu_tier.load_prompts(cfg.prompts_file, tokenizer)
    t0 = time.perf_counter()
    run.generator, start, run.facts["mla_disabled"], mla_start = mla.start(
        run.model,
        lambda: HarnessGenerator(
            cfg.model_path,
            cfg.layer_ids,
            max_model_len=cfg.max_model_len,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            tensor_parallel_size=cfg.tp,
            options=_options(cfg, run.language_model_only),
        ),
        cfg.attention_backend,
    )
    if not start.ok:
        raise RuntimeError(f"the shimmed generator did not start on {cfg.model_path}: {start.text}")
    run.mla = mla.probe(run.model.subject, tc, run.facts["mla_disabled"], start, cfg.attention_backend, mla_start)
    run.facts["generator_start_s"] = round(time.perf_counter() - t0, 2)
    run.facts["layer_ids"] = run.generator.layer_ids
    run.facts["engaged_shims"] = run.generator.engaged_shims()
    run.facts["moe_methods"] = gpu_tier.moe_methods_of(run.generator)
    try:
        yield run
    finally:
        if not run.closed:
            run.generator.close()
        gpu_report.write(run.model_name, run.cfg, run.prompts, run.facts, versions.snapshot())
