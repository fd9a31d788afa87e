"""What the static gate's checks share: the decoder stacks the harness runs, and small lookups in the used
surface. The checks themselves live in their contracts' modules (`CONTRACT.gate_checks`)."""

from __future__ import annotations

from harness.vllm_source.facts import Fact

#: The decoder stacks the harness runs (tiny-llama, tiny-deepseek-v3; Kimi-K2.5's stack is DeepseekV2Model):
#: family -> (module, stack class, decoder layer class, causal-LM class).
FAMILIES = {
    "llama": ("vllm.model_executor.models.llama", "LlamaModel", "LlamaDecoderLayer", "LlamaForCausalLM"),
    "deepseek_v2": (
        "vllm.model_executor.models.deepseek_v2",
        "DeepseekV2Model",
        "DeepseekV2DecoderLayer",
        "DeepseekV2ForCausalLM",
    ),
}
KIMI = ("vllm.model_executor.models.kimi_k25", "KimiK25ForConditionalGeneration", "deepseek_v2")


def not_found(contract: str, symbol: str, check: str, what: str) -> Fact:
    return Fact(contract, symbol, check, f"{what} not found in these sources", None)


def imported(used, name: str) -> str | None:
    return next((s for s in used.imported_symbols() if s.endswith(":" + name)), None)


def site(call) -> str:
    return f"{call.module.rsplit('.', 1)[-1]}.py:{call.line}"


def parse_file(path):
    from harness.vllm_source.source_files import parse

    return parse(str(path))
