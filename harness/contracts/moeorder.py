"""C-moeorder: one routing, one token layout in vLLM's Marlin MoE, so the same batch gives the same states twice.

speculators extracts training data and assumes the same batch gives the same hidden states every time. vLLM's
Marlin MoE path (the kernel it picks for INT4 experts, Kimi-K2.5 as released) groups each expert's tokens with
`moe_align_block_size`, whose CUDA kernel places them with atomics: the same routing gets different, equally legal
block layouts from call to call, and Marlin's output depends on a token's place (vllm-project/vllm#52525, open).
Seen on the Kimi-K2.5 INT4 slice on an H100 with vLLM 0.25.0: the same batch twice differed by up to 4.1, the
routed experts' runner being the first module to change on equal inputs (harness.gpu.module_determinism).

Probe (in the worker): where the loaded model runs MoE layers on Marlin, vLLM's aligner is called several times on
one seeded routing of the model's expert count and top-k; speculators' path holds when every layout is the same.
Shim (in the worker, engaged only where that probe finds layouts that differ): the aligner Marlin's MoE module
calls is wrapped so that each expert's run of token slots comes back sorted (`canonical_order`): one layout per
routing. A model with no MoE layer on Marlin (every model on vLLM's CPU wheel) is not applicable; Marlin MoE layers
with the aligner not where the shim looks (the module moved) are broken, never n/a.
"""

from __future__ import annotations

import functools
import importlib

from harness.contracts.base import Attach, Attempt, Contract, Observation, Shim

#: Where vLLM's Marlin MoE experts look the aligner up (a module global) and its name.
MARLIN_MODULE = "vllm.model_executor.layers.fused_moe.experts.marlin_moe"
ALIGNER = "moe_align_block_size"
FAILURE = "NondeterministicLayout"
#: The probe's routing: tokens, calls of the aligner, block size (Marlin MoE's smallest), seed.
TOKENS, CALLS, BLOCK, SEED = 2048, 5, 16, 2026


def canonical_order(sorted_ids, expert_ids, block_size: int):
    """`sorted_ids` (int32 token-slot ids, `block_size` a block, block b belonging to `expert_ids[b]`) with each run of
    consecutive blocks of one expert sorted ascending, in place; returned. Slots past the blocks are left alone."""
    import torch

    blocks = min(int(expert_ids.numel()), int(sorted_ids.numel()) // block_size)
    if blocks == 0:
        return sorted_ids
    used = sorted_ids[: blocks * block_size].view(blocks, block_size)
    experts = expert_ids[:blocks]
    starts = torch.ones(blocks, dtype=torch.bool, device=experts.device)
    starts[1:] = experts[1:] != experts[:-1]
    run = torch.cumsum(starts.to(torch.int64), 0).view(-1, 1)
    key = (run << 32) | (used.to(torch.int64) & 0xFFFFFFFF)
    ordered = torch.sort(key.view(-1)).values & 0xFFFFFFFF
    used.copy_(ordered.to(torch.int32).view(blocks, block_size))  # the int32 round trip restores negative ids
    return sorted_ids


def marlin_module():
    """vLLM's Marlin MoE module, or None on a build without it (or whose import of it fails)."""
    try:
        return importlib.import_module(MARLIN_MODULE)
    except Exception:  # noqa: BLE001 - a build without the kernel (or whose import of it fails) has no such path
        return None


def vllm_aligner(module):
    """vLLM's own aligner in `module` (under the shim's wrapper where it is engaged)."""
    current = getattr(module, ALIGNER)
    return getattr(current, "_harness_inner", current)


def engage(module) -> bool:
    """Wrap `module`'s aligner with `canonical_order` (once)."""
    current = getattr(module, ALIGNER)
    if getattr(current, "_harness_canonical", False):
        return True

    def aligned(topk_ids, block_size, *args, **kwargs):
        sorted_ids, expert_ids, padded = current(topk_ids, block_size, *args, **kwargs)
        return canonical_order(sorted_ids, expert_ids, block_size), expert_ids, padded

    aligned.__dict__.update(_harness_canonical=True, _harness_inner=current)  # marks: engaged, and what it wraps
    setattr(module, ALIGNER, aligned)
    return True


def marlin_moe_layers(model) -> dict:
    """{"layers": MoE layers whose quantization method runs on Marlin, "experts", "top_k"} of a loaded model."""
    found = {"layers": 0, "experts": 0, "top_k": 0}
    for module in model.modules():
        qm, cfg = getattr(module, "quant_method", None), getattr(module, "moe_config", None)
        if qm is None or cfg is None:
            continue
        backend = " ".join(str(v) for k, v in getattr(qm, "__dict__", {}).items() if "backend" in k.lower())
        if "marlin" not in f"{type(qm).__name__} {backend}".lower():  # the class, or the backend it chose
            continue
        found["layers"] += 1
        found["experts"] = int(getattr(cfg, "num_experts", 0) or getattr(module, "global_num_experts", 0))
        found["top_k"] = int(getattr(cfg, "experts_per_token", 0) or getattr(module, "top_k", 0))
    return found


def layouts(aligner, experts: int, top_k: int, device, canonical: bool) -> list:
    """The aligner's layouts of one seeded routing, CALLS times (made canonical where asked)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(SEED)
    scores = torch.rand(TOKENS, experts, generator=gen, device=device)
    topk_ids = scores.topk(top_k, dim=-1).indices.to(torch.int32)
    out = []
    for _ in range(CALLS):
        sorted_ids, expert_ids, _padded = aligner(topk_ids, BLOCK, experts)
        out.append(canonical_order(sorted_ids.clone(), expert_ids, BLOCK) if canonical else sorted_ids.clone())
    return out


def _differing(found: list) -> int:
    import torch

    return sum(not torch.equal(found[0], other) for other in found[1:])


def worker_probe(worker) -> dict:
    """Not applicable (why), or speculators' attempt (vLLM's layouts) and the shimmed one (canonical layouts)."""
    # read here, not through a helper: the gate's shim surface (harness.installed.surface) sees the runner names used here
    model = worker.model_runner.get_model() if hasattr(worker.model_runner, "get_model") else worker.model_runner.model
    facts = marlin_moe_layers(model)
    if not facts["layers"]:
        return {"not_applicable": f"{type(model).__name__} runs no MoE layer on Marlin", "facts": facts}
    module = marlin_module()
    if module is None or not hasattr(module, ALIGNER):  # Marlin MoE runs, but not where the shim looks: broken
        moved = Attempt.failed("AlignerMoved", f"{MARLIN_MODULE}.{ALIGNER} not found")
        return {"unshimmed": moved, "shimmed": moved, "facts": facts}
    device = next(model.parameters()).device
    aligner = vllm_aligner(module)
    attempts = {}
    for label, canonical in (("unshimmed", False), ("shimmed", True)):
        ran, found = Attempt.run(
            functools.partial(layouts, aligner, facts["experts"], facts["top_k"], device, canonical)
        )
        if not ran.ok:
            attempts[label] = ran
            continue
        differ = _differing(found)
        facts[f"{label}_differing_layouts"] = differ
        attempts[label] = (
            Attempt(True)
            if differ == 0
            else Attempt.failed(
                FAILURE,
                f"{differ} of {CALLS - 1} further calls of {ALIGNER} gave another layout of the same routing "
                f"({TOKENS} tokens, top-{facts['top_k']} of {facts['experts']} experts)",
            )
        )
    return {**attempts, "facts": facts}


def apply_worker(worker):
    """Engage the canonical order where the probe finds vLLM's layouts differ; None where not applicable."""
    r = worker_probe(worker)
    if r.get("not_applicable"):
        return None
    return engage(marlin_module()) if not r["unshimmed"].ok and r["shimmed"].ok else False


def probe(ctx) -> Observation:
    r = ctx.worker_call(worker_probe)
    if r.get("not_applicable"):
        return Observation(CONTRACT, Attempt(True), None, r["facts"], not_applicable=r["not_applicable"])
    return Observation.of(CONTRACT, r["unshimmed"], r["shimmed"], r["facts"])


CONTRACT = Contract(
    id="moeorder",
    assumes="the same batch gives the same MoE output twice (Marlin MoE's token layout is one per routing)",
    failures=(rf"{FAILURE}: ",),
    shims=(Shim(Attach.WORKER, apply_worker),),
    side="worker",
    native_says="vLLM's aligner gives one layout per routing",
    broken_says="the canonical order does not make the layouts equal",
    gate_outside="whether a CUDA kernel's layout repeats is observed by running it; sources cannot decide it",
    upstream="vllm-project/vllm#52525 (open): Marlin MoE output depends on the aligner's within-expert token order",
)
