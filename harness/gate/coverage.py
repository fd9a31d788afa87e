"""Which contract owns which piece of speculators' vLLM surface, and which shim covers which finding. Data.

A shim covers a finding only when its code handles that exact kind of change, and what it needs is
still there: e.g. the kv-helpers shim aliases helpers that moved to one of `kv_helpers.NEW_HOMES`,
so a helper that moved anywhere else is a finding no shim covers (NEEDS-NEW-SHIM). Every entry
says why. The conditions read the shims' own constants where the shims have them, so the table
follows the shims. `validate()` checks that every contract id and shim named here exists.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable

from harness.contracts import eagle3, kimi_stack, kv_helpers, layers
from harness.gate.facts import SURFACE, Finding

# -- ownership: (import symbol glob, chain after it or None for any, contract) -------------------------
#: The first matching row owns a fact; anything else is SURFACE (used vLLM API outside every contract).
OWNERS: tuple[tuple[str, str | None, str], ...] = (
    (f"{kv_helpers.OLD_HOME}:*", None, "kvhelpers"),
    ("vllm.v1.core.sched.scheduler:Scheduler", "", "sched"),
    ("vllm.v1.request:Request", "", "request"),
    ("vllm.config:SchedulerConfig", "", "schedcfg"),
    ("vllm.config:CacheConfig", "", "prefixcache"),
    ("vllm.v1.executor.multiproc_executor:MultiprocExecutor", "().collective_rpc", "rpc"),
    ("vllm.v1.executor.multiproc_executor:MultiprocExecutor", "().execute_model", "twophase"),
    ("vllm.model_executor.models.interfaces:supports_eagle3", None, "eagle3"),
)


def owner(head: str, chain: str) -> str:
    for pattern, wanted_chain, contract in OWNERS:
        if fnmatch.fnmatchcase(head, pattern) and (wanted_chain is None or chain == wanted_chain):
            return contract
    return SURFACE


#: Contracts no reading of vLLM's Python sources can decide, with why. The gate lists them as not
#: checked (with the dynamic hook's answer) instead of passing them silently; a contract that is
#: neither checked nor listed here makes the gate undecided.
OUTSIDE: dict[str, str] = {
    "import": "speculators' own import depends on the installed transformers, which vLLM's Python sources "
              "do not pin; each env's conformance run checks it",
    "chunkedprefill": "whether a batch over one step's budget is chunked or reordered is the scheduler's behaviour "
                      "under load (defaults, queue order), not a signature: each env's run extracts such a batch",
}


# -- coverage --------------------------------------------------------------------------------------------
def _always(_: Finding) -> bool:
    return True


@dataclass(frozen=True)
class Cover:
    contract: str
    kind: str
    shim: str  # dotted path of the code that restores the contract
    reason: str  # what the shim does about this kind of change
    when: Callable[[Finding], bool] = _always  # the exact change it handles
    condition: str = ""  # `when`, in words


COVERS: tuple[Cover, ...] = (
    Cover("kvhelpers", "keyword-removed", "harness.contracts.kv_helpers.apply",
          "wraps get_kv_cache_config_from_groups and passes only the keywords the installed helper takes",
          lambda f: ":get_kv_cache_config_from_groups(" in f.symbol, "the helper is get_kv_cache_config_from_groups"),
    Cover("kvhelpers", "import-moved", "harness.contracts.kv_helpers.install_import_aliases",
          "sets each helper that left kv_cache_utils back on kv_cache_utils from its new home, so "
          "speculators' import works",
          lambda f: f.detail.get("moved_to") in kv_helpers.NEW_HOMES and f.detail.get("name") in kv_helpers.HELPERS,
          f"the helper moved to one of {', '.join(kv_helpers.NEW_HOMES)}"),
    Cover("request", "keyword-removed", "harness.contracts.request.apply",
          "drops eos_token_id where Request no longer takes it (a prefill-only request never reaches EOS)",
          lambda f: f.detail.get("keyword") == "eos_token_id", "the keyword is eos_token_id"),
    Cover("request", "block-hashes-required", "harness.contracts.request.apply",
          "attaches vLLM's own request block hasher, built the way EngineCore builds it, when the config "
          "caches prefixes",
          lambda f: bool(f.detail.get("hasher_helpers_present")),
          "kv_cache_utils still has get_request_block_hasher and init_none_hash"),
    Cover("sched", "required-parameter-added", "harness.contracts.scheduler.apply",
          "passes block_size (and hash_block_size where it exists) from the config speculators built",
          lambda f: set(f.detail.get("parameters", ())) <= {"block_size", "hash_block_size"},
          "the new required parameters are block_size/hash_block_size"),
    Cover("schedcfg", "required-parameter-added", "harness.contracts.scheduler_config.apply",
          "passes is_encoder_decoder=False (speculators only serves decoder-only targets)",
          lambda f: set(f.detail.get("parameters", ())) <= {"is_encoder_decoder"},
          "the new required parameter is is_encoder_decoder"),
    Cover("rpc", "reply-unwrapped", "harness.executor_view.ExecutorView.collective_rpc",
          "wraps rank 0's single reply in a list, as speculators indexes [0] (reply shape learned by an echo RPC)"),
    Cover("twophase", "two-phase-execute", "harness.executor_view.ExecutorView.execute_model",
          "calls sample_tokens(None) after an execute_model() that returned None, as EngineCore does",
          lambda f: bool(f.detail.get("executor_sample_tokens")), "the executor has sample_tokens"),
    Cover("embed", "method-renamed", "harness.contracts.embed.apply_worker",
          "aliases get_input_embeddings to embed_input_ids on the stack instance",
          lambda f: f.detail.get("new_name") == "embed_input_ids", "the stack has embed_input_ids"),
    Cover("eagle3", "interface-missing", "harness.contracts.eagle3.accepting",
          f"accepts a model without SupportsEagle3 whose decoder stack has {', '.join(eagle3.STACK_ATTRS)}",
          lambda f: not f.detail.get("stack_missing"), "the decoder stack still has those attributes"),
    Cover("kimistack", "stack-moved", "harness.contracts.kimi_stack.apply_worker",
          "finds the decoder stack at a known path and aliases it as model.model on the instance",
          lambda f: f.detail.get("path") in kimi_stack.CANDIDATES,
          f"the stack is at one of {', '.join(kimi_stack.CANDIDATES)}"),
    Cover("prefixcache", "default-changed", "harness.contracts.prefix_cache.apply",
          "builds speculators' CacheConfig with enable_prefix_caching=False"),
    Cover("layer", "layer-call-extended", "harness.contracts.layers.worker_probe",
          "not a shim: the extra argument only carries a value when the checkpoint's config sets the matching key, "
          "and the given checkpoint config (--model-config) sets none of them; the runtime probe guards the rest",
          lambda f: set(f.detail.get("not_passed_by_speculators", ())) <= set(layers.CONFIG_GATED)
          and "checkpoint_config" in f.detail
          and not any(f.detail["checkpoint_config"].get(layers.CONFIG_GATED[k])
                      for k in f.detail.get("not_passed_by_speculators", ())),
          f"the extras are config-gated ({', '.join(layers.CONFIG_GATED)}) and --model-config leaves them unset"),
    Cover("kvlayout", "layout-resolution-required", "harness.contracts.kv_layout.apply_executor",
          "resolves the layout from the workers' supported layouts and KV-cache specs and publishes it, as EngineCore does",
          lambda f: bool(f.detail.get("resolver_present")), "resolve_kv_cache_layout exists"),
    Cover("blocksize", "block-size-unsupported", "harness.contracts.block_size.apply",
          "moves speculators' block size to the smallest one the attention backend declares"),
    Cover("mla", "platform-rejects-mla", "harness.contracts.mla.apply_env",
          "runs with VLLM_MLA_DISABLE=1: vLLM expands MLA to multi-head attention over the same weights",
          lambda f: bool(f.detail.get("env_defined")), "vllm.envs still defines VLLM_MLA_DISABLE"),
)


def attach_checkpoint_config(findings: list[Finding], config: dict) -> None:
    """Give config-gated findings the target checkpoint's values for the keys that gate them."""
    for f in findings:
        if f.contract == "layer":
            f.detail["checkpoint_config"] = {key: config.get(key) for key in layers.CONFIG_GATED.values()}


def needs_model_config(finding: Finding) -> bool:
    """A config-gated finding no source can decide: whether it matters depends on the target checkpoint's
    config, and none was given (--model-config)."""
    extras = set(finding.detail.get("not_passed_by_speculators", ()))
    return (finding.contract == "layer" and finding.kind == "layer-call-extended" and bool(extras)
            and extras <= set(layers.CONFIG_GATED) and "checkpoint_config" not in finding.detail)


MODEL_CONFIG_HINT = ("depends on the target checkpoint's config ({keys}); pass --model-config /path/to/config.json "
                     "to decide")


def cover(finding: Finding) -> Cover | None:
    """The shim that covers `finding`, or None (NEEDS-NEW-SHIM)."""
    return next((c for c in COVERS if c.contract == finding.contract and c.kind == finding.kind and c.when(finding)),
                None)


def uncovered_reason(finding: Finding) -> str:
    near = [c for c in COVERS if c.contract == finding.contract and c.kind == finding.kind]
    if near:
        return f"{near[0].shim} handles this kind of change only when {near[0].condition}"
    extra = finding.detail.get("not_passed_by_speculators")
    if extra:
        return (f"the stack's own loop passes {', '.join(extra)} to each layer, speculators' patched loop does not; "
                f"no shim restores that")
    return f"no shim handles a {finding.kind} change in {finding.contract}"


def validate(contract_ids: list[str]) -> list[str]:
    """Problems with the table: unknown contract ids, shims that do not exist."""
    known = set(contract_ids) | {SURFACE}
    problems = [f"unknown contract {c!r} in OWNERS" for _, _, c in OWNERS if c not in known]
    problems += [f"unknown contract {c.contract!r} in COVERS" for c in COVERS if c.contract not in known]
    problems += [f"unknown contract {c!r} in OUTSIDE" for c in OUTSIDE if c not in known]
    for c in COVERS:
        if not _resolves(c.shim):
            problems.append(f"shim {c.shim} does not exist")
    return problems


def _resolves(dotted: str) -> bool:
    from harness.contracts.base import resolve

    try:
        resolve(dotted)
    except LookupError:
        return False
    return True
