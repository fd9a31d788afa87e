"""speculators' used vLLM surface is read from its installed source, not typed by hand."""

from __future__ import annotations

from harness.installed import surface


def test_generator_calls_read_from_source():
    s = surface.surface(surface.GENERATOR_MODULE)
    assert s.keywords_of("Scheduler") == ["vllm_config", "kv_cache_config", "structured_output_manager"]
    assert "eos_token_id" in s.keywords_of("Request") and "block_hasher" not in s.keywords_of("Request")
    assert "kv_cache_specs" in s.keywords_of("get_kv_cache_config_from_groups")
    assert s.imports["Scheduler"] == "vllm.v1.core.sched.scheduler:Scheduler"
    assert "_get_captured_states" in s.rpc_methods


def test_worker_surface():
    s = surface.surface(surface.WORKER_MODULE)
    assert s.imports["supports_eagle3"] == "vllm.model_executor.models.interfaces:supports_eagle3"
    assert "self.get_input_embeddings" in s.attributes and "model.model" in s.attributes


def test_parse_from_text():
    s = surface.parse(
        "m", "from vllm.x import A\nA(b=1, c=2)\nself.executor.collective_rpc('go', unique_reply_rank=0)\n"
    )
    assert s.keywords_of("A") == ["b", "c"] and s.rpc_methods == ["go"] and s.imports == {"A": "vllm.x:A"}


def test_the_committed_shim_surface_is_the_one_the_code_shows():
    """fixtures/surfaces/harness-shims.json is derived from the harness's shim code; edited code with a stale
    fixture would gate yesterday's shims (regenerate: python -m harness surface --shims)."""
    import json

    from harness.vllm_source import shim_surface

    committed = json.loads(shim_surface.FIXTURE.read_text())
    assert committed == shim_surface.derive(), "stale: run `python -m harness surface --shims` and commit the fixture"
    kinds = {(e["kind"], e["name"], e["site"]) for e in committed["entries"]}
    assert ("runner", "model", "harness/contracts/embed.py:apply_worker") in kinds
    assert ("rpc", "disable_extensible_kv_cache", "harness/contracts/kvlayout.py:no_extensible_cache") in kinds
    assert ("rpc", "set_kv_cache_layout", "harness/contracts/kvlayout.py:resolve_layout") in kinds
    assert ("module", "vllm.v1.attention.backends.utils", "harness/contracts/kvlayout.py:_resolver") in kinds
