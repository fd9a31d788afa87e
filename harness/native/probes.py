"""Probes of the native path that start no engine: what this vLLM has (the speculative method, the
connector), and whether its engine config takes the native keys for a model."""

from __future__ import annotations

import functools
import re
import tempfile
import typing

from harness.native.engine import CONNECTOR, METHOD, engine_args, engine_kwargs, speculative_config
from harness.native.layer_ids import map_layer_ids
from harness.native.rows import NativeProbe, checked


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

    return checked(
        f"speculative method {METHOD!r} exists",
        "typing.get_args(vllm.config.speculative.SpeculativeMethod)",
        speculative_methods,
        verdict,
    )


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

    return checked(f"kv connector {CONNECTOR!r} is registered", "KVConnectorFactory._registry[...]()", look, verdict)


def availability() -> tuple[bool, str]:
    """Whether the native path can run here, and if not, why in full (the probes' own words): this vLLM has no
    export, or this build's model runner refuses it."""
    for probe in (probe_method(), probe_connector()):
        if probe.result != "pass":
            return False, f"no native hidden-state export in this vLLM: {probe.check}: {probe.measured}"
    refusal = runner_refusal()
    if refusal:
        return False, refusal
    return True, f"{METHOD!r} and {CONNECTOR!r} present"


#: vLLM's refusal of a config its standalone (no-Triton) CPU runner cannot run (VllmConfig._validate_model_runner).
RUNNER_REFUSES = re.compile(r"(The CPU )?model runner without Triton does not yet support: [^|\[]*speculative decoding")


@functools.cache
def runner_refusal() -> str | None:
    """Where the harness chose the CPU model runner, not vLLM (harness.envs.cpu_runner: vLLM's standalone runner,
    because triton-cpu is not installable here): whether that runner refuses speculative decoding, the engine mode
    vLLM's export runs in. Asked of vLLM itself: an engine config with the native keys for the suite's global tiny
    model. Then the native path and the server clients are not runnable on this build (not broken in vLLM): said
    with vLLM's words, never as a pass."""
    from harness import contracts
    from harness.installed import versions
    from harness.subjects import models

    chosen = versions.runtime()
    if chosen is None:
        return None
    probe = probe_config(models.build(contracts.global_model()), [1])
    said = RUNNER_REFUSES.search(probe.measured) if probe.result != "pass" else None
    if said is None:
        return None
    return f'not runnable on this build: {chosen}; vLLM refuses the export there: "{said.group(0).strip()}"'


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
        got = {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "eagle_aux_hidden_state_layer_ids": ids,
            "kv_connector": kv.kv_connector,
            "kv_role": kv.kv_role,
        }
        return (spec.method == METHOD and ids == native and kv.kv_connector == CONNECTOR), got

    return checked(
        "speculative_config + kv_transfer_config accepted and carried into the engine config",
        f"EngineArgs(speculative_config={speculative_config(native)}, kv_transfer_config="
        f"{{kv_connector: {CONNECTOR}, ...}}, enable_chunked_prefill=False).create_engine_config()",
        lambda: engine_args(kw).create_engine_config(),
        verdict,
    )


def probe_chunked_prefill(model, layer_ids: list[int]) -> NativeProbe:
    """Whether the native keys work with vLLM's default scheduler (chunked prefill on), or need it off."""
    from harness.contracts import mla

    mla.prepare(model)
    native = sorted(set(map_layer_ids(layer_ids, model.num_layers)))
    kw = engine_kwargs(model, native, tempfile.gettempdir(), chunked_prefill=True)
    kw.pop("max_num_batched_tokens")  # vLLM's own default for a chunked scheduler

    def verdict(cfg):
        return True, f"accepted (chunked prefill {'on' if cfg.scheduler_config.enable_chunked_prefill else 'off'})"

    return checked(
        "native keys accepted with vLLM's default scheduler (chunked prefill on)",
        "EngineArgs(<native keys>, enable_chunked_prefill default).create_engine_config()",
        lambda: engine_args(kw).create_engine_config(),
        verdict,
    )


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

    return checked(
        f"{model.architecture} implements SupportsEagle3",
        f"supports_eagle3(ModelRegistry._try_load_model_cls({model.architecture!r}))",
        look,
        verdict,
    )


def connector_writes_lock_files() -> bool:
    """Whether the installed connector's module creates `<file>.lock` (the async writer, 0.22+): read from
    its source, independently of what the export we got looked like."""
    import inspect

    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    cls = KVConnectorFactory._registry[CONNECTOR]()
    module = inspect.getmodule(cls)
    return module is not None and ".lock" in inspect.getsource(module)
