"""vLLM's `LLM` with the native export turned on: its engine arguments, the exporter (always shut down) and
its error."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.contracts.base import summarize
from harness.native.engine_log import engine_output_to, root_cause
from harness.native.files import NativeExport, layers_asked, layout_of, read_export
from harness.native.layer_ids import map_layer_ids
from harness.support import shm_orphans

METHOD = "extract_hidden_states"
CONNECTOR = "ExampleHiddenStatesConnector"


def speculative_config(native_ids: list[int]) -> dict:
    return {
        "method": METHOD,
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(native_ids)}},
    }


def kv_transfer_config(storage: str | os.PathLike, sync_writer: bool = False) -> dict:
    """The export's KV connector; `sync_writer`: harness.native.sync_writer's subclass of it (a CPU build's
    synchronous host copies in place of the CUDA copy stream), loaded through kv_connector_module_path."""
    config = {
        "kv_connector": CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    if sync_writer:
        from harness.native import sync_writer as sw

        config.update(kv_connector=sw.NAME, kv_connector_module_path=sw.MODULE)
    return config


def default_gpu_memory_utilization(wanted: float = 0.8) -> float:
    """`wanted`, but never more of the card than is free now (CUDA only; other platforms ignore it).

    vLLM refuses to start when its fraction of the whole device exceeds the free memory, and in the
    suites our shared generator is already holding its own share of the same GPU.
    """
    from vllm.platforms import current_platform

    if current_platform.device_type != "cuda":
        return wanted
    import torch

    free, total = torch.cuda.mem_get_info()
    return round(max(0.05, min(wanted, free / total - 0.05)), 3)


def engine_kwargs(
    model,
    native_ids: list[int],
    storage,
    *,
    max_model_len: int = 512,
    chunked_prefill: bool = False,
    attention_backend: str | None = None,
    gpu_memory_utilization: float | None = None,
    dtype: str = "float32",
) -> dict:
    """`LLM(**kwargs)` for the native path on `model` (a harness.subjects.models.TinyModel), float32 unless `dtype` says
    otherwise (the GPU benchmark's real shapes run in bfloat16, as plain prefill and ours do there).

    Scheduler limits follow speculators' (32 sequences per step) and the harness benchmark's, with
    prefix caching off as in our generator: a repeated prompt must be computed again, not served
    from the cache, on both paths. Chunked prefill is off because the connector refuses it from
    0.22 ("does not support chunked prefill"); `probe_chunked_prefill` records that requirement.
    """
    from vllm.engine.arg_utils import EngineArgs

    from harness.runtime.generator import attention_backend_kwargs, text_only_kwargs

    kw = dict(
        model=str(model.path),
        dtype=dtype,
        max_model_len=max_model_len,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_num_seqs=32,
        max_num_batched_tokens=max(8192, max_model_len),
        gpu_memory_utilization=gpu_memory_utilization or default_gpu_memory_utilization(),
        seed=0,
        trust_remote_code=True,
        speculative_config=speculative_config(native_ids),
        kv_transfer_config=kv_transfer_config(storage),
    )
    if not chunked_prefill:
        kw["enable_chunked_prefill"] = False
    if (model.run_options or {}).get("language_model_only"):
        kw.update(text_only_kwargs(EngineArgs))  # Kimi-K2.5: the text stack only, as our generator runs it
    backend = attention_backend or (model.run_options or {}).get("attention_backend")
    if backend:
        kw.update(attention_backend_kwargs(backend))
    return kw


def engine_args(kwargs: dict):
    """EngineArgs as LLM(...) builds them from the same keywords (LLM turns the kv dict into KVTransferConfig)."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    kw = dict(kwargs)
    if isinstance(kw.get("kv_transfer_config"), dict):
        kw["kv_transfer_config"] = KVTransferConfig(**kw["kv_transfer_config"])
    return EngineArgs(**kw)


class NativeExportError(RuntimeError):
    """The native path failed; `stage` says where (start, extract) and `root_cause` what vLLM's engine said."""

    def __init__(self, stage: str, error: BaseException, root_cause: str | None, log: str):
        self.stage, self.error, self.root_cause, self.log = stage, error, root_cause, log
        said = f"{type(error).__name__}: {summarize(str(error), 200)}"
        if root_cause and root_cause not in said:
            said = f"{root_cause} (in the engine's log; the caller got {said})"
        super().__init__(f"native path failed at {stage}: {said}")


class NativeExporter:
    """vLLM's LLM with the native export turned on, for one tiny model and a fixed set of layers.

    `layer_ids` are in speculators' convention unless `convention="native"` (used to show what the
    unmapped ids give). vLLM captures each distinct layer once, in stack order: the engine is asked
    for the sorted distinct native ids and `extract` hands back one tensor per requested id in the
    order asked, as our generator does. The engine is always shut down: on `close()`, on `with` exit,
    and when the start fails half-way.
    """

    def __init__(
        self,
        model,
        layer_ids: list[int],
        *,
        convention: str = "speculators",
        max_model_len: int = 512,
        attention_backend: str | None = None,
        gpu_memory_utilization: float | None = None,
        storage_dir: str | os.PathLike | None = None,
        dtype: str = "float32",
    ):
        from harness.contracts import mla

        self.model = model
        self.layer_ids = [int(i) for i in layer_ids]
        if convention == "speculators":
            self.native_ids = map_layer_ids(self.layer_ids, model.num_layers)
        elif convention == "native":
            bad = [i for i in self.layer_ids if not 0 <= i <= model.num_layers]
            if bad:
                raise ValueError(f"native layer ids {bad} out of range 0..{model.num_layers}")
            self.native_ids = list(self.layer_ids)
        else:
            raise ValueError(f"convention must be 'speculators' or 'native', not {convention!r}")
        self.engine_ids = sorted(set(self.native_ids))
        self._own_dir = storage_dir is None
        self.dir = Path(storage_dir) if storage_dir else Path(tempfile.mkdtemp(prefix="native-export-"))
        self.storage = self.dir / "hidden_states"
        self.storage.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "engine.log"
        self.llm: Any = None  # vLLM's LLM, once started
        self._shm_before = shm_orphans.entries()  # what the engine's dead core may leave is new since then
        mla.prepare(model)  # the same attention decision our generator made for this model
        self.kwargs = engine_kwargs(
            model,
            self.engine_ids,
            self.storage,
            max_model_len=max_model_len,
            attention_backend=attention_backend,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
        )
        t0 = time.perf_counter()
        try:
            from vllm import LLM

            with engine_output_to(self.log_path):
                self.llm = LLM(**self.kwargs)
        except Exception as exc:
            log = self._log()  # read before close() removes the folder
            self.close()
            raise NativeExportError("start", exc, root_cause(log), log) from exc
        self.start_s = time.perf_counter() - t0

    def _root_cause_after_failure(self, wait_s: float = 10.0) -> str | None:
        """The engine's own error, once it has reached the log (a dying writer logs just after letting go)."""
        deadline = time.monotonic() + wait_s
        while True:
            cause = root_cause(self._log())
            if cause or time.monotonic() > deadline:
                return cause
            time.sleep(0.5)

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def generate(self, prompts: list[list[int]]):
        """vLLM's own call: one output per prompt, in order, each with its kv_transfer_params."""
        from vllm import SamplingParams

        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        return self.llm.generate(requests, SamplingParams(max_tokens=1), use_tqdm=False)

    def extract(self, prompts: list[list[int]], *, keep_files: bool = False) -> list[NativeExport]:
        """Run `prompts` (token-id lists) through the native path and read the files back."""
        if self.llm is None:
            raise RuntimeError("the native exporter is closed")
        try:
            outputs = self.generate(prompts)
        except Exception as exc:
            raise NativeExportError("extract", exc, root_cause(self._log()), self._log()) from exc
        results = []
        for out in outputs:
            params = dict(getattr(out, "kv_transfer_params", None) or {})
            path = params.get("hidden_states_path")
            if not path:
                raise NativeExportError(
                    "extract", KeyError(f"no hidden_states_path in kv_transfer_params {params}"), None, ""
                )
            try:
                data, waited = read_export(path, remove=not keep_files)
            except OSError as exc:
                raise NativeExportError("extract", exc, self._root_cause_after_failure(), self._log()) from exc
            layout = layout_of(data)
            try:
                per_layer = layers_asked(data, path, self.engine_ids, self.native_ids)
            except ValueError as exc:
                raise NativeExportError("extract", exc, None, "") from exc
            tokens = [int(t) for t in data["token_ids"].tolist()] if "token_ids" in data else []
            results.append(NativeExport(per_layer, tokens, path, params, layout, waited))
        return results

    def close(self) -> None:
        """Shut the engine (and its worker processes) down; idempotent; removes our temporary folder."""
        llm, self.llm = self.llm, None
        if llm is not None:
            from harness.scenarios.bench import shutdown

            shutdown(llm)
            del llm
        shm_orphans.discard_unmapped_since(self._shm_before)  # a dead engine core's queue (vLLM 0.30 on CPU)
        if self._own_dir and os.environ.get("HARNESS_KEEP_NATIVE_LOG") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> NativeExporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_native_export(model, prompts: list[list[int]], layer_ids: list[int], **options) -> list[NativeExport]:
    """Per prompt: the native path's tensors (one per speculators-convention layer id) and token ids.

    Starts vLLM's LLM with the native export on `model`, extracts, and always shuts it down.
    """
    with NativeExporter(model, layer_ids, **options) as exporter:
        return exporter.extract(prompts)
