"""vLLM's own hidden-state export (vLLM >= 0.17), run on a tiny model as a cross-check of ours.

From vLLM 0.17 a user need not patch vLLM at all to get hidden states: the speculative-decoding
method `extract_hidden_states` stacks the target's EAGLE-3 auxiliary hidden states and the KV
connector `ExampleHiddenStatesConnector` writes them, per request, to
`<shared_storage_path>/<request id>.safetensors` (tensors `hidden_states` [tokens, layers, hidden]
and `token_ids`), returning the file in `kv_transfer_params["hidden_states_path"]`. speculators
moved to that path in 0.5.0. If both paths agree on the tiny models, ours is right twice over; if
they do not, one of them is wrong, and the report says where.

The two paths number layers differently, and confusing them gives numbers that look plausible
and are one whole decoder layer off:

* speculators' in-process id k is the OUTPUT of decoder layer k (hidden_states + residual after it);
* vLLM's native id k is the INPUT of decoder layer k, i.e. the output of layer k - 1; id 0 is the
  embeddings and id n (n = number of layers) is the last layer's output, before the final norm.

`map_layer_ids` is the one place that shift lives. Everything else here is vLLM's own public
path (`LLM(...)`, `SamplingParams(max_tokens=1)`, the files it writes), driven as its offline
example drives it, so a failure is vLLM's behaviour and not a harness artefact. Availability is
decided by probing what this vLLM has (the speculative-method literal, the connector registry),
never by its version string.

Environment: the caller sets what every vLLM start here needs (the pytest plugin does:
VLLM_CPU_KVCACHE_SPACE, HF_HUB_OFFLINE, spawned workers). MLA models go through
`harness.contracts.mla.prepare`, the same decision the shared generator made, so both paths run the
same attention.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
import time
import typing
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import fdio
from harness.contracts.base import Attempt, Contract, Observation, summarize

def _native_contract(id: str, assumes: str, native_says: str = "holds on this vLLM") -> Contract:
    """A contract of vLLM's own export: no shim (we report, not repair), any failure documented as itself."""
    return Contract(id=id, assumes=assumes, failures=(r".",), shim=None, native_says=native_says,
                    broken_says="does not hold here")


#: The cross-check as a contract row `native[<model>]`, expected per vLLM version like the others.
#: native: vLLM's own export runs here and equals ours at the mapped ids; broken: this vLLM has the
#: export but it does not run on this platform for the model, or it disagrees (reason says which);
#: n/a: this vLLM has no native export, or no such model class. There is no shim: we report, not repair.
CONTRACT = _native_contract(
    "native", "vLLM's own extract_hidden_states export gives the hidden states ours gives, at ids mapped k -> k + 1",
    native_says="vLLM's native export runs here and agrees with ours")

#: The native path's own contracts, each a row like the others (expected per vLLM version, no shim: where one
#: does not hold, the native path cannot be used here and the reason says why). `native-path` once per vLLM;
#: the others once per tiny model (`native-config[tiny-llama]`, ...). Built from NativeProbes by `observe`.
PATH_CONTRACT = _native_contract(
    "native-path",
    "vLLM has the speculative method 'extract_hidden_states' and the KV connector 'ExampleHiddenStatesConnector'")
CONFIG_CONTRACT = _native_contract(
    "native-config",
    "EngineArgs accept speculative_config {method: extract_hidden_states, eagle_aux_hidden_state_layer_ids} and "
    "kv_transfer_config {kv_connector: ExampleHiddenStatesConnector} for the model, and carry them into the engine config")
EAGLE3_CONTRACT = _native_contract(
    "native-eagle3",
    "the model class vLLM loads for the checkpoint implements SupportsEagle3 (the native path collects "
    "auxiliary hidden states through it)")
FILES_CONTRACT = _native_contract(
    "native-files",
    "each request returns kv_transfer_params['hidden_states_path']; the safetensors file holds hidden_states "
    "[tokens, layers, hidden] float32 and token_ids == the prompt, complete once its lock (if any) is released")
#: Per-model native contracts, in the order a user meets them.
PER_MODEL_CONTRACTS = (CONFIG_CONTRACT, EAGLE3_CONTRACT, FILES_CONTRACT, CONTRACT)

METHOD = "extract_hidden_states"
CONNECTOR = "ExampleHiddenStatesConnector"
#: vLLM's native id of speculators' layer k is k + NATIVE_SHIFT (see map_layer_ids).
NATIVE_SHIFT = 1


# -- the layer-id convention ------------------------------------------------------------------------
def map_layer_ids(layer_ids, num_layers: int, *, to: str = "native") -> list[int]:
    """Translate layer ids between speculators' convention and vLLM's native one; order is kept.

    `to="native"`: speculators' id k (output of decoder layer k, 0 <= k < n) -> vLLM's id k + 1
    (input of layer k + 1; for k = n - 1 that is id n, the last layer's output before the final norm).
    `to="speculators"`: the inverse, vLLM's id j (1 <= j <= n) -> j - 1. vLLM's id 0 (the embeddings,
    the input of layer 0) has no speculators id: speculators never captures the embeddings.

    Ids outside the valid range raise ValueError instead of wrapping around silently: an id that
    is off by one is exactly the mistake this function exists to prevent.
    """
    n = int(num_layers)
    ids = [int(i) for i in layer_ids]
    if to == "native":
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"speculators layer ids {bad} out of range 0..{n - 1} (the model has {n} decoder layers)")
        return [i + NATIVE_SHIFT for i in ids]
    if to == "speculators":
        bad = [i for i in ids if not NATIVE_SHIFT <= i <= n]
        if bad:
            raise ValueError(f"vLLM native layer ids {bad} have no speculators equivalent: valid 1..{n} "
                             f"(native 0 is the embeddings; the model has {n} decoder layers)")
        return [i - NATIVE_SHIFT for i in ids]
    raise ValueError(f"to must be 'native' or 'speculators', not {to!r}")


# -- probe results ---------------------------------------------------------------------------------
@dataclass
class NativeProbe:
    """One contract of the native path, observed: what was called, what came back, whether it holds.

    `attempt` is the call (ok, or the exception it raised, as harness.contracts.base records it);
    `holds` is the verdict on what came back when the call returned (None: nothing to judge);
    `not_applicable` says why the contract cannot be observed here (e.g. no native path at all).
    """

    check: str
    called: str
    attempt: Attempt
    returned: Any = None
    holds: bool | None = None
    not_applicable: str | None = None

    @property
    def result(self) -> str:
        if self.not_applicable:
            return "n/a"
        return "pass" if self.attempt.ok and self.holds is not False else "fail"

    @property
    def measured(self) -> str:
        if self.not_applicable:
            return self.not_applicable
        said = f"{self.called} -> "
        said += f"{self.returned}" if self.attempt.ok else self.attempt.text
        return summarize(said, 900)

    def to_json(self) -> dict:
        return {"check": self.check, "called": self.called, "result": self.result, "returned": _jsonable(self.returned),
                "ok": self.attempt.ok, "error_type": self.attempt.error_type, "error": self.attempt.error,
                "raised_at": self.attempt.detail.get("raised_at"), "not_applicable": self.not_applicable}


def _jsonable(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)


def _checked(check: str, called: str, fn, verdict=None) -> NativeProbe:
    """Run `fn`; `verdict(value) -> (holds, returned)` judges what came back."""
    attempt, value = Attempt.run(fn)
    if not attempt.ok:
        return NativeProbe(check, called, attempt)
    holds, returned = verdict(value) if verdict else (None, value)
    return NativeProbe(check, called, attempt, returned, holds)


# -- availability (import / registry probes) --------------------------------------------------------
def speculative_methods() -> list[str]:
    """The methods this vLLM's SpeculativeConfig accepts, read from its `method` literal."""
    from vllm.config import speculative

    literal = getattr(speculative, "SpeculativeMethod", None)
    if literal is None:
        literal = speculative.SpeculativeConfig.__dataclass_fields__["method"].type

    def flatten(t) -> list[str]:
        out = []
        for a in typing.get_args(t):
            out += [a] if isinstance(a, str) else flatten(a)
        return out

    return flatten(literal)


def probe_method() -> NativeProbe:
    """The speculative method `extract_hidden_states` exists (SpeculativeConfig's method literal)."""
    def verdict(methods):
        has = METHOD in methods
        return has, (f"{METHOD!r} among {len(methods)} methods" if has else f"{METHOD!r} absent; methods: {methods}")
    return _checked(f"speculative method {METHOD!r} exists", "typing.get_args(vllm.config.speculative.SpeculativeMethod)",
                    speculative_methods, verdict)


def probe_connector() -> NativeProbe:
    """The KV connector is registered with vLLM's factory, and its class imports."""
    def look():
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        registry = getattr(KVConnectorFactory, "_registry", {})
        if CONNECTOR not in registry:
            return None, sorted(registry)
        cls = registry[CONNECTOR]()
        return cls, sorted(registry)

    def verdict(value):
        cls, names = value
        if cls is None:
            return False, f"{CONNECTOR!r} not registered; registered: {names}"
        return True, f"registered -> {cls.__module__}.{cls.__qualname__}"
    return _checked(f"kv connector {CONNECTOR!r} is registered", "KVConnectorFactory._registry[...]()", look, verdict)


def availability() -> tuple[bool, str]:
    """Whether this vLLM has the native path at all, and if not, why (the probes' own words)."""
    for probe in (probe_method(), probe_connector()):
        if probe.result != "pass":
            return False, f"{probe.check}: {probe.measured}"
    return True, f"{METHOD!r} and {CONNECTOR!r} present"


# -- engine arguments -------------------------------------------------------------------------------
def speculative_config(native_ids: list[int]) -> dict:
    return {"method": METHOD, "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(native_ids)}}}


def kv_transfer_config(storage: str | os.PathLike) -> dict:
    return {"kv_connector": CONNECTOR, "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(storage)}}


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


def engine_kwargs(model, native_ids: list[int], storage, *, max_model_len: int = 512, chunked_prefill: bool = False,
                  attention_backend: str | None = None, gpu_memory_utilization: float | None = None) -> dict:
    """`LLM(**kwargs)` for the native path on `model` (a harness.models.TinyModel), float32.

    Scheduler limits follow speculators' (32 sequences per step) and the harness benchmark's, with
    prefix caching off as in our generator: a repeated prompt must be computed again, not served
    from the cache, on both paths. Chunked prefill is off because the connector refuses it from
    0.22 ("does not support chunked prefill"); `probe_chunked_prefill` records that requirement.
    """
    from vllm.engine.arg_utils import EngineArgs

    from harness.generator import attention_backend_kwargs, text_only_kwargs

    kw = dict(model=str(model.path), dtype="float32", max_model_len=max_model_len, enforce_eager=True,
              enable_prefix_caching=False, max_num_seqs=32, max_num_batched_tokens=max(8192, max_model_len),
              gpu_memory_utilization=gpu_memory_utilization or default_gpu_memory_utilization(), seed=0,
              trust_remote_code=True,
              speculative_config=speculative_config(native_ids), kv_transfer_config=kv_transfer_config(storage))
    if not chunked_prefill:
        kw["enable_chunked_prefill"] = False
    if (model.run_options or {}).get("language_model_only"):
        kw.update(text_only_kwargs(EngineArgs))  # Kimi-K2.5: the text stack only, as our generator runs it
    backend = attention_backend or (model.run_options or {}).get("attention_backend")
    if backend:
        kw.update(attention_backend_kwargs(backend))
    return kw


def _engine_args(kwargs: dict):
    """EngineArgs as LLM(...) builds them from the same keywords (LLM turns the kv dict into KVTransferConfig)."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    kw = dict(kwargs)
    if isinstance(kw.get("kv_transfer_config"), dict):
        kw["kv_transfer_config"] = KVTransferConfig(**kw["kv_transfer_config"])
    return EngineArgs(**kw)


# -- config-level probes (no engine started) ----------------------------------------------------------
def probe_config(model, layer_ids: list[int]) -> NativeProbe:
    """The engine config builds with the native keys, and carries them: method, layer ids, connector."""
    from harness.contracts import mla

    mla.prepare(model)
    native = sorted(set(map_layer_ids(layer_ids, model.num_layers)))
    kw = engine_kwargs(model, native, tempfile.gettempdir())

    def verdict(cfg):
        spec = cfg.speculative_config
        ids = list(getattr(spec.draft_model_config.hf_config, "eagle_aux_hidden_state_layer_ids", []) or [])
        kv = cfg.kv_transfer_config
        got = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
               "eagle_aux_hidden_state_layer_ids": ids, "kv_connector": kv.kv_connector, "kv_role": kv.kv_role}
        return (spec.method == METHOD and ids == native and kv.kv_connector == CONNECTOR), got
    return _checked("speculative_config + kv_transfer_config accepted and carried into the engine config",
                    f"EngineArgs(speculative_config={speculative_config(native)}, kv_transfer_config="
                    f"{{kv_connector: {CONNECTOR}, ...}}, enable_chunked_prefill=False).create_engine_config()",
                    lambda: _engine_args(kw).create_engine_config(), verdict)


def probe_chunked_prefill(model, layer_ids: list[int]) -> NativeProbe:
    """Whether the native keys work with vLLM's default scheduler (chunked prefill on), or need it off."""
    from harness.contracts import mla

    mla.prepare(model)
    native = sorted(set(map_layer_ids(layer_ids, model.num_layers)))
    kw = engine_kwargs(model, native, tempfile.gettempdir(), chunked_prefill=True)
    kw.pop("max_num_batched_tokens")  # vLLM's own default for a chunked scheduler

    def verdict(cfg):
        return True, f"accepted (chunked prefill {'on' if cfg.scheduler_config.enable_chunked_prefill else 'off'})"
    return _checked("native keys accepted with vLLM's default scheduler (chunked prefill on)",
                    "EngineArgs(<native keys>, enable_chunked_prefill default).create_engine_config()",
                    lambda: _engine_args(kw).create_engine_config(), verdict)


def probe_supports_eagle3(model) -> NativeProbe:
    """The target class implements SupportsEagle3, which the native path needs to collect aux states.

    Without it the GPU model runner raises at load ("Model does not support EAGLE3 interface but
    aux_hidden_state_outputs was requested"); in 0.17 the refusal comes earlier, from the speculative
    config's allow-list of model types ("extract_hidden_states is only supported for [...] models").
    DeepseekV2/V3 and Kimi-K2.5 gain it in 0.18. Read from the model registry: the class vLLM would
    instantiate for the checkpoint's architecture. What an engine start does is recorded separately.
    """
    def look():
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_eagle3

        cls = ModelRegistry._try_load_model_cls(model.architecture)
        if cls is None:
            raise LookupError(f"{model.architecture} is not in this vLLM's model registry")
        return cls, bool(supports_eagle3(cls))

    def verdict(value):
        cls, ok = value
        return ok, f"{cls.__name__}: supports_eagle3 = {ok}"
    return _checked(f"{model.architecture} implements SupportsEagle3",
                    f"supports_eagle3(ModelRegistry._try_load_model_cls({model.architecture!r}))", look, verdict)


# -- the files ---------------------------------------------------------------------------------------
@dataclass
class NativeExport:
    """One request's export, read back: per requested layer one [tokens, hidden] tensor, in the order asked."""

    hidden_states: list
    token_ids: list[int]
    path: str
    kv_transfer_params: dict
    layout: dict  # tensor name -> (shape, dtype) as stored in the file
    waited_on_lock: bool  # the file came with `<file>.lock` (async writer, vLLM >= 0.22)


def read_export(path: str, *, remove: bool = True) -> tuple[dict, bool]:
    """The tensors of one native export file, honouring the async writer's lock-file protocol.

    From vLLM 0.22 the connector writes files in a background thread: before the request's path is
    returned it creates `<file>.lock` and holds an exclusive flock on it until the write is done. A
    reader takes a shared flock (sleeping until the writer lets go), reads, then deletes the lock
    file. Earlier versions write the file synchronously in the forward pass and create no lock.
    The lock is opened read-write: flock on network file systems needs a writable descriptor.
    """
    from safetensors.torch import load_file

    lock = path + ".lock"
    waited = os.path.exists(lock)
    if waited:
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if not os.path.exists(path):  # the writer let go without writing: its thread or process died
                raise FileNotFoundError(f"{lock} was released but {path} was never written (the writer failed)")
            data = load_file(path, device="cpu")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        os.remove(lock)
    elif not os.path.exists(path):
        raise FileNotFoundError(f"the native export {path} does not exist (and no {lock} to wait on)")
    else:
        data = load_file(path, device="cpu")
    if remove:
        os.remove(path)
    return data, waited


# -- running the native path ---------------------------------------------------------------------------
class NativeExportError(RuntimeError):
    """The native path failed; `stage` says where (start, extract) and `root_cause` what vLLM's engine said."""

    def __init__(self, stage: str, error: BaseException, root_cause: str | None, log: str):
        self.stage, self.error, self.root_cause, self.log = stage, error, root_cause, log
        said = f"{type(error).__name__}: {summarize(str(error), 200)}"
        if root_cause and root_cause not in said:
            said = f"{root_cause} (in the engine's log; the caller got {said})"
        super().__init__(f"native path failed at {stage}: {said}")


_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:(?:ERROR|WARNING|INFO|DEBUG)\s+\S+\s+\S+\s+\[[^\]]*\]\s?)?")
_EXC_LINE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit))(?::\s*(.*))?$")
_FILE_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
#: Exceptions that only say "see above": the root cause is the first exception line that is not one of them.
_WRAPPERS = ("Engine core initialization failed", "Worker failed with error", "EngineCore encountered",
             "EngineDeadError", "See root cause above", "see stack trace")


#: Failures of the platform, not of the layers asked for: retrying with other layer ids cannot change them.
_PLATFORM_FAILURE = re.compile(r"spec decode is not supported|CUDA|cuda|NVIDIA driver")


def platform_failure(error: "NativeExportError") -> bool:
    """Whether the native path failed for a reason of this platform (e.g. a CUDA-only stream on a CPU build)."""
    return bool(_PLATFORM_FAILURE.search(error.root_cause or str(error)))


def root_cause(log: str) -> str | None:
    """The first real exception in vLLM's engine/worker output, with where it was raised.

    The engine and its workers are separate processes: what reaches the caller is a wrapper ("Engine
    core initialization failed. See root cause above."). The cause is in their log, as a traceback
    whose last line names the exception; that line (and the frame above it) is what the report needs.
    """
    from harness.contracts.base import short_path

    where = None
    for raw in log.splitlines():
        line = _LOG_PREFIX.sub("", raw.rstrip())
        frame = _FILE_LINE.match(line)
        if frame:
            where = f"{short_path(frame.group(1))}:{frame.group(2)} in {frame.group(3)}"
            continue
        m = _EXC_LINE.match(line.strip())
        if not m or any(w in line for w in _WRAPPERS):
            continue
        text = f"{m.group(1)}: {m.group(2) or ''}".rstrip(": ")
        return summarize(text + (f" @ {where}" if where else ""), 400)
    return None


@contextmanager
def _engine_output_to(log_path: Path):
    """Send this process's fds 1 and 2 to `log_path` while vLLM starts its engine and workers: the children
    inherit them, so their tracebacks (vLLM logs them to stdout) land in the file for `root_cause` to read."""
    with open(log_path, "ab", buffering=0) as fh, fdio.fds_to(fh):
        yield


class NativeExporter:
    """vLLM's LLM with the native export turned on, for one tiny model and a fixed set of layers.

    `layer_ids` are in speculators' convention unless `convention="native"` (used to show what the
    unmapped ids give). vLLM captures each distinct layer once, in stack order: the engine is asked
    for the sorted distinct native ids and `extract` hands back one tensor per requested id in the
    order asked, as our generator does. The engine is always shut down: on `close()`, on `with` exit,
    and when the start fails half-way.
    """

    def __init__(self, model, layer_ids: list[int], *, convention: str = "speculators", max_model_len: int = 512,
                 attention_backend: str | None = None, gpu_memory_utilization: float | None = None,
                 storage_dir: str | os.PathLike | None = None):
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
        self.llm = None
        mla.prepare(model)  # the same attention decision our generator made for this model
        self.kwargs = engine_kwargs(model, self.engine_ids, self.storage, max_model_len=max_model_len,
                                    attention_backend=attention_backend, gpu_memory_utilization=gpu_memory_utilization)
        t0 = time.perf_counter()
        try:
            from vllm import LLM

            with _engine_output_to(self.log_path):
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
        for prompt, out in zip(prompts, outputs):
            params = dict(getattr(out, "kv_transfer_params", None) or {})
            path = params.get("hidden_states_path")
            if not path:
                raise NativeExportError("extract", KeyError(f"no hidden_states_path in kv_transfer_params {params}"),
                                        None, "")
            try:
                data, waited = read_export(path, remove=not keep_files)
            except OSError as exc:
                raise NativeExportError("extract", exc, self._root_cause_after_failure(), self._log()) from exc
            layout = {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in data.items()}
            hs = data.get("hidden_states")
            if hs is None or hs.dim() != 3 or hs.shape[1] != len(self.engine_ids):
                raise NativeExportError("extract", ValueError(
                    f"{path}: expected hidden_states [tokens, {len(self.engine_ids)}, hidden], file holds {layout}"), None, "")
            per_layer = [hs[:, self.engine_ids.index(j), :] for j in self.native_ids]
            tokens = [int(t) for t in data["token_ids"].tolist()] if "token_ids" in data else []
            results.append(NativeExport(per_layer, tokens, path, params, layout, waited))
        return results

    def close(self) -> None:
        """Shut the engine (and its worker processes) down; idempotent; removes our temporary folder."""
        llm, self.llm = self.llm, None
        if llm is not None:
            from harness.bench import shutdown

            shutdown(llm)
            del llm
        if self._own_dir and os.environ.get("HARNESS_KEEP_NATIVE_LOG") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "NativeExporter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_native_export(model, prompts: list[list[int]], layer_ids: list[int], **options) -> list[NativeExport]:
    """Per prompt: the native path's tensors (one per speculators-convention layer id) and token ids.

    Starts vLLM's LLM with the native export on `model`, extracts, and always shuts it down.
    """
    with NativeExporter(model, layer_ids, **options) as exporter:
        return exporter.extract(prompts)


# -- contracts observed on a run ------------------------------------------------------------------------
def probe_run(start: Attempt, called: str) -> NativeProbe:
    """The native path starts and extracts on this platform (the start+first extraction attempt)."""
    return NativeProbe("native path runs on this platform (engine start + extraction)", called, start,
                       "ok" if start.ok else None)


def probe_path_returned(export: NativeExport) -> NativeProbe:
    p = export.kv_transfer_params.get("hidden_states_path")
    return NativeProbe("kv_transfer_params['hidden_states_path'] returned per request",
                       "RequestOutput.kv_transfer_params", Attempt(True), {"hidden_states_path": p}, bool(p))


def probe_layout(export: NativeExport, prompt: list[int], num_layers_requested: int, hidden_size: int) -> NativeProbe:
    """The file holds exactly `hidden_states` [tokens, layers, hidden] float32 and `token_ids` == the prompt."""
    lay = export.layout
    want = {"hidden_states": ((len(prompt), num_layers_requested, hidden_size), "float32"),
            "token_ids": ((len(prompt),), None)}
    ok = set(lay) == set(want) and all(lay[k][0] == shape and (dt is None or lay[k][1] == dt)
                                       for k, (shape, dt) in want.items())
    ok = ok and export.token_ids == [int(t) for t in prompt]
    returned = {k: f"{list(s)} {d}" for k, (s, d) in lay.items()}
    returned["token_ids == prompt"] = export.token_ids == [int(t) for t in prompt]
    return NativeProbe("file layout: hidden_states [tokens, layers, hidden] float32, token_ids == prompt",
                       "safetensors.torch.load_file(hidden_states_path)", Attempt(True), returned, ok)


def connector_writes_lock_files() -> bool:
    """Whether the installed connector's module creates `<file>.lock` (the async writer, 0.22+): read from
    its source, independently of what the export we got looked like."""
    import inspect

    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    cls = KVConnectorFactory._registry[CONNECTOR]()
    return ".lock" in inspect.getsource(inspect.getmodule(cls))


def probe_write_protocol(export: NativeExport, writes_locks: bool) -> NativeProbe:
    """The reader honoured the connector's write protocol: a connector whose writer creates `<file>.lock`
    must have handed us a file with its lock (read under a shared flock, then removed); one without must
    have handed over a complete file. Fails when the file and the connector's protocol disagree, or a lock
    file is left behind after reading."""
    how = ("async: <file>.lock held by the writer, read under a shared flock, then removed" if export.waited_on_lock
           else "synchronous: file complete when the request returns, no lock file")
    if writes_locks != export.waited_on_lock:
        return NativeProbe("write protocol (lock file) handled", "read_export(hidden_states_path)", Attempt.failed(
            "ContractViolated", f"the connector {'creates' if writes_locks else 'creates no'} lock files, but the "
            f"export came {'without' if writes_locks else 'with'} one ({how})"), how, False)
    if os.path.exists(export.path + ".lock"):
        return NativeProbe("write protocol (lock file) handled", "read_export(hidden_states_path)", Attempt.failed(
            "ContractViolated", f"{os.path.basename(export.path)}.lock is still there after reading"), how, False)
    return NativeProbe("write protocol (lock file) handled", "read_export(hidden_states_path)", Attempt(True), how, True)


# -- probes -> contract rows ---------------------------------------------------------------------------
def observe(contract: Contract, probes: list[NativeProbe], subject: str | None = None,
            not_applicable: str | None = None) -> Observation:
    """The row for `contract` from the probes that make it up: native if every probe holds, broken with the
    first failing probe's words if one does not, n/a (with the reason) where none can be observed here.
    Each probe's call and result stay in the row's facts."""
    obs = Observation(contract, Attempt(True), subject=subject)
    obs.facts["checks"] = [p.to_json() for p in probes]
    observable = [p for p in probes if not p.not_applicable]
    if not_applicable or not observable:
        obs.not_applicable = not_applicable or (probes[0].not_applicable if probes else "nothing observed")
        return obs
    failed = [p for p in observable if p.result == "fail"]
    if failed:
        first = failed[0]
        err = first.attempt if not first.attempt.ok else Attempt.failed("ContractViolated", first.measured)
        obs.unshimmed = Attempt.failed(err.error_type or "ContractViolated",
                                       f"{first.check}: {err.error}", **err.detail)
    return obs


def observe_path(method: NativeProbe, connector: NativeProbe) -> Observation:
    """`native-path`: n/a where this vLLM has neither (no native export yet), broken where only one half is there."""
    results = {method.result, connector.result}
    if results == {"fail"}:
        return observe(PATH_CONTRACT, [method, connector], not_applicable=(
            f"no native hidden-state export in this vLLM: {method.measured}; {connector.measured}"))
    return observe(PATH_CONTRACT, [method, connector])
