"""Targeted static checks: the contracts about behaviour, defaults and return shapes, read from source.

The used surface shows names and keywords; these read what a signature cannot: what
`collective_rpc(unique_reply_rank=)` returns, whether the runner is two-phase, a field's default,
which interface a model class implements, where Kimi-K2.5 keeps its decoder stack, what the
stack's own loop passes to each layer. Each check applies only where speculators' surface uses the
thing it reads (e.g. the rpc check needs a call with `unique_reply_rank`), and answers `holds=None`
(not checked) rather than guess when it cannot find what it reads.
"""

from __future__ import annotations

import ast
import re

from harness.contracts import (blocksize, eagle3, embed, kimistack, kvhelpers, kvlayout, layer, memory, mla,
                               prefixcache, request, rpc, twophase)
from harness.gate.facts import Fact
from harness.gate.tree import Tree
from harness.gate.used_surface import UsedSurface

#: The decoder stacks the harness runs (tiny-llama, tiny-deepseek-v3; Kimi-K2.5's stack is DeepseekV2Model):
#: family -> (module, stack class, decoder layer class, causal-LM class).
FAMILIES = {
    "llama": ("vllm.model_executor.models.llama", "LlamaModel", "LlamaDecoderLayer", "LlamaForCausalLM"),
    "deepseek_v2": ("vllm.model_executor.models.deepseek_v2", "DeepseekV2Model", "DeepseekV2DecoderLayer",
                    "DeepseekV2ForCausalLM"),
}
KIMI = ("vllm.model_executor.models.kimi_k25", "KimiK25ForConditionalGeneration", "deepseek_v2")
RUNNER = "vllm.v1.worker.gpu_model_runner"
STATE_ERROR = "sample_tokens() must be called"
OLD_EMBED, NEW_EMBED = "get_input_embeddings", "embed_input_ids"
PLATFORM = ("vllm.platforms.interface", "Platform", "get_device_total_memory")  # what the memory shim calls
CPU_PLATFORM = "vllm.platforms.cpu"
MLA_REJECTED = "MLA is not supported on"
ENVS = "vllm.envs"
HASHER_HELPERS = ("get_request_block_hasher", "init_none_hash")  # what the request shim builds the hasher with


def seed_modules(used: UsedSurface) -> set[str]:
    """Modules to load from the start (more are loaded as lookups ask for them)."""
    seeds = {s.split(":")[0] for s in used.imported_symbols()}
    seeds |= {m for m, *_ in FAMILIES.values()} | {KIMI[0], PLATFORM[0]}
    return seeds


def _not_found(contract: str, symbol: str, check: str, what: str) -> Fact:
    return Fact(contract, symbol, check, f"{what} not found in these sources", None)


def _imported(used: UsedSurface, name: str) -> str | None:
    return next((s for s in used.imported_symbols() if s.endswith(":" + name)), None)


def _site(call) -> str:
    return f"{call.module.rsplit('.', 1)[-1]}.py:{call.line}"


# -- C-rpc ---------------------------------------------------------------------------------------------
def _unwraps(value) -> bool:
    """`return replies[0]` (or either branch of a conditional doing so): one rank's reply, not the list."""
    if isinstance(value, ast.IfExp):
        return _unwraps(value.body) or _unwraps(value.orelse)
    return isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) and value.slice.value == 0


def rpc_return(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    facts = []
    for call in (c for c in used.calls if "unique_reply_rank" in c.keywords):
        ref = follower.follow(call.module, call.callee)
        symbol = f"{ref.symbol if ref else call.callee}(unique_reply_rank=)"
        node = tree.node(ref.obj) if ref and ref.obj is not None and ref.obj.is_function else None
        if node is None:
            facts.append(_not_found(rpc.CONTRACT.id, symbol, "return-shape", "collective_rpc"))
            continue
        returns = [r for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
        single = [r for r in returns if _unwraps(r.value)]
        listing = [r for r in returns if isinstance(r.value, ast.Name)]
        line = (single or listing or returns or [node])[0].lineno
        facts.append(Fact(rpc.CONTRACT.id, symbol, "return-shape", "single reply" if single else "list of replies",
                          not single, "reply-unwrapped", tree.where(ref.obj, line), _site(call)))
    return facts


# -- C-twophase ----------------------------------------------------------------------------------------
def two_phase(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    facts = []
    for call in (c for c in used.calls if c.callee.endswith(".execute_model")):
        ref = follower.follow(call.module, call.callee)
        symbol = ref.symbol if ref else call.callee
        if not ref or ref.obj is None or not ref.steps:
            facts.append(_not_found(twophase.CONTRACT.id, symbol, "protocol", "execute_model"))
            continue
        executor = ref.steps[-1][1]
        sample = tree.member(executor, "sample_tokens")
        guard = tree.string_lines(RUNNER, STATE_ERROR)
        runner = tree.module_file(RUNNER)
        if guard:
            evidence = f"{runner.relative_to(tree.root)}:{guard[0]}"
        else:
            evidence = tree.where(sample) if sample is not None else tree.where(ref.obj)
        parked = sample is not None or bool(guard)
        value = ("execute_model() returns None and parks its state until sample_tokens()"
                 + (" (State error guard)" if guard else "")) if parked else "execute_model() completes the step"
        facts.append(Fact(twophase.CONTRACT.id, symbol, "protocol", value, not parked, "two-phase-execute",
                          evidence, _site(call), {"executor_sample_tokens": sample is not None}))
    return facts


# -- C-embed -------------------------------------------------------------------------------------------
def embed_method(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    if not used.calls_named("self." + OLD_EMBED):
        return []
    facts = []
    for module, stack, *_ in FAMILIES.values():
        symbol = f"{module}:{stack}.{OLD_EMBED}"
        cls = tree.lookup(f"{module}.{stack}")
        if cls is None:
            facts.append(_not_found(embed.CONTRACT.id, symbol, "method", stack))
            continue
        old, new = tree.member(cls, OLD_EMBED), tree.member(cls, NEW_EMBED)
        value = OLD_EMBED if old is not None else f"{NEW_EMBED} only" if new is not None else "neither"
        facts.append(Fact(embed.CONTRACT.id, symbol, "method", value, old is not None, "method-renamed",
                          tree.where(old or new or cls), detail={"new_name": NEW_EMBED if new is not None else None}))
    return facts


# -- C-prefixcache and the block-hash half of C-request ------------------------------------------------
def _default(attr) -> str:
    text = "" if attr.value is None else str(attr.value)
    m = re.match(r"Field\((?:.*\b)?default=([^,)]+)", text)
    return m.group(1).strip() if m else text or "(required)"


def _caching(tree: Tree, used: UsedSurface, follower):
    """(CacheConfig.enable_prefix_caching attribute, whether speculators' CacheConfig gets it on)."""
    symbol = _imported(used, "CacheConfig")
    cls = follower.resolve_import(symbol) if symbol else None
    attr = tree.member(cls, "enable_prefix_caching") if cls is not None else None
    if attr is None:
        return None, None
    passed = any("enable_prefix_caching" in c.keywords for c in used.calls_named("CacheConfig"))
    return attr, (not passed and _default(attr) == "True")


def prefix_caching(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    symbol = f"{_imported(used, 'CacheConfig')}.enable_prefix_caching"
    attr, on = _caching(tree, used, follower)
    if attr is None:
        return [_not_found(prefixcache.CONTRACT.id, symbol, "default", "CacheConfig.enable_prefix_caching")]
    return [Fact(prefixcache.CONTRACT.id, symbol, "default", f"default {_default(attr)}", not on, "default-changed",
                 tree.where(attr, attr.lineno))]


def block_hashes(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    symbol = _imported(used, "Request")
    cls = follower.resolve_import(symbol) if symbol else None
    sig = tree.signature(cls, bound=True) if cls is not None else None
    attr, caching_on = _caching(tree, used, follower)
    if sig is None or attr is None:
        return [_not_found(request.CONTRACT.id, f"{symbol}(block_hasher=)", "block-hashes", "Request or CacheConfig")]
    param = sig.named("block_hasher")
    passed = any("block_hasher" in c.keywords for c in used.calls_named("Request"))
    needed = param is not None and not passed and caching_on
    helpers = all(tree.lookup(f"{kvhelpers.OLD_HOME}.{h}") is not None for h in HASHER_HELPERS)
    value = "needed: prefix caching is on by default and speculators passes no block_hasher" if needed else "not needed"
    evidence = f"{sig.where.rsplit(':', 1)[0]}:{param.line}" if needed and param.line else tree.where(attr, attr.lineno)
    return [Fact(request.CONTRACT.id, f"{symbol}(block_hasher=)", "block-hashes", value, not needed,
                 "block-hashes-required", evidence, detail={"hasher_helpers_present": helpers})]


# -- C-eagle3 and C-kimistack --------------------------------------------------------------------------
def _interface(tree: Tree, used: UsedSurface, follower) -> str:
    """The class `supports_eagle3` tests with isinstance (read from its body)."""
    symbol = _imported(used, "supports_eagle3")
    fn = follower.resolve_import(symbol) if symbol else None
    node = tree.node(fn) if fn is not None and fn.is_function else None
    for n in ast.walk(node) if node else ():
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance" and len(n.args) == 2:
            return ast.unparse(n.args[1]).rsplit(".", 1)[-1]
    return "SupportsEagle3"


def eagle3_support(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    if not _imported(used, "supports_eagle3"):
        return []
    interface = _interface(tree, used, follower)
    targets = [(m, lm, fam) for fam, (m, _, _, lm) in FAMILIES.items()] + [KIMI]
    facts = []
    for module, name, family in targets:
        symbol = f"{module}:{name}"
        cls = tree.lookup(f"{module}.{name}")
        if cls is None:
            if tree.module_file(module) is None and module == KIMI[0]:
                facts.append(Fact(eagle3.CONTRACT.id, symbol, "interface", "absent (no such model)", True))
            else:
                facts.append(_not_found(eagle3.CONTRACT.id, symbol, "interface", name))
            continue
        has = interface in tree.base_names(cls)
        stack_module, stack = FAMILIES[family][0], FAMILIES[family][1]
        stack_cls = tree.lookup(f"{stack_module}.{stack}")
        missing = [a for a in eagle3.STACK_ATTRS if stack_cls is None or tree.member(stack_cls, a) is None]
        facts.append(Fact(eagle3.CONTRACT.id, symbol, "interface", interface if has else f"no {interface}", has,
                          "interface-missing", tree.where(cls), detail={"stack_missing": missing}))
    return facts


def _assigned(init_node, attribute: str):
    for n in ast.walk(init_node):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == attribute and getattr(t.value, "id", "") == "self":
                    return n
    return None


def kimi_stack_path(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    module, name, _ = KIMI
    symbol = f"{module}:{name}.model"
    if tree.module_file(module) is None:
        return [Fact(kimistack.CONTRACT.id, symbol, "stack-path", "absent (no such model)", True)]
    cls = tree.lookup(f"{module}.{name}")
    init = tree.member(cls, "__init__") if cls is not None else None
    node = tree.node(init) if init is not None else None
    if node is None:
        return [_not_found(kimistack.CONTRACT.id, symbol, "stack-path", f"{name}.__init__")]
    own, lm = _assigned(node, "model"), _assigned(node, "language_model")
    if own is not None:
        path, line = "model", own.lineno
    elif lm is not None and isinstance(lm.value, ast.Call):
        callee = ast.unparse(lm.value.func)
        target = tree.lookup(f"{module}.{callee}")
        if target is not None and target.is_class and tree.member(target, "layers") is not None:
            path = "language_model"
        elif (target is not None and target.is_class and tree.member(target, "model") is not None) or \
                callee.endswith("init_vllm_registered_model"):
            path = "language_model.model"  # a registered *ForCausalLM wrapper: its stack is .model
        else:
            path = None
        line = lm.lineno
    else:
        path, line = None, node.lineno
    if path is None:
        return [_not_found(kimistack.CONTRACT.id, symbol, "stack-path", "a recognisable decoder stack")]
    return [Fact(kimistack.CONTRACT.id, symbol, "stack-path", path, path == "model", "stack-moved",
                 tree.where(init, line), detail={"path": path})]


# -- C-layer -------------------------------------------------------------------------------------------
def _passed(call: ast.Call) -> list[str]:
    names = [a.id if isinstance(a, ast.Name) else ast.unparse(a) for a in call.args]
    return names + [k.arg or "**" + ast.unparse(k.value) for k in call.keywords]


def layer_calls(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    from harness.gate.calls import Ref, call_facts

    spec_calls = used.calls_named("layer")
    if not spec_calls:
        return []
    passes = set(spec_calls[0].keywords)
    facts = []
    for module, stack, layer_cls, _ in FAMILIES.values():
        forward = tree.member(tree.lookup(f"{module}.{stack}"), "forward")
        node = tree.node(forward) if forward is not None else None
        layer_fwd = tree.member(tree.lookup(f"{module}.{layer_cls}"), "forward")
        if node is None or layer_fwd is None:
            facts.append(_not_found(layer.CONTRACT.id, f"{module}:{stack}.forward", "layer-call", f"{stack}/{layer_cls}"))
            continue
        own = [n for n in ast.walk(node) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "layer"]
        if not own:
            facts.append(_not_found(layer.CONTRACT.id, f"{module}:{stack}.forward", "layer-call", "layer(...) call"))
            continue
        passed = _passed(own[0])
        # `**kwargs` the stack's forward only forwards from its own caller are not values the stack
        # computes; were any passed, speculators' replacement forward would refuse them loudly.
        forwarded = {f"**{p.name}" for p in forward.parameters if p.kind.value == "variadic keyword"}
        extra = sorted(set(passed) - passes - forwarded)
        facts.append(Fact(layer.CONTRACT.id, f"{module}:{stack}.forward", "layer-call", ", ".join(passed),
                          not extra, "layer-call-extended", tree.where(forward, own[0].lineno),
                          detail={"not_passed_by_speculators": extra}))
        ref = Ref(f"{module}:{layer_cls}", "().forward", layer_fwd, bound=True)
        for call in spec_calls:
            facts += call_facts(tree, ref, call, layer.CONTRACT.id)
    return facts


# -- C-mla and C-memory: what their shims need ---------------------------------------------------------
def mla_platform(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    env_lines = tree.string_lines(ENVS, mla.ENV)
    envs = tree.module_file(ENVS)
    env_where = f"{envs.relative_to(tree.root)}:{env_lines[0]}" if env_lines else None
    facts = [Fact(mla.CONTRACT.id, f"{ENVS}:{mla.ENV}", "shim-dependency", "defined" if env_lines else "absent",
                  bool(env_lines), "shim-dependency-missing", env_where)]
    rejects = tree.string_lines(CPU_PLATFORM, MLA_REJECTED)
    cpu = tree.module_file(CPU_PLATFORM)
    if cpu is None:
        return facts + [_not_found(mla.CONTRACT.id, f"{CPU_PLATFORM} (MLA)", "platform", "the CPU platform")]
    facts.append(Fact(mla.CONTRACT.id, f"{CPU_PLATFORM} (MLA)", "platform",
                      "rejects MLA" if rejects else "does not reject MLA", not rejects, "platform-rejects-mla",
                      f"{cpu.relative_to(tree.root)}:{rejects[0] if rejects else 1}",
                      detail={"env_defined": bool(env_lines)}))
    return facts


def memory_budget(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    module, cls_name, method = PLATFORM
    symbol = f"{module}:{cls_name}.{method}"
    cls = tree.lookup(f"{module}.{cls_name}")
    if cls is None:
        return [_not_found(memory.CONTRACT.id, symbol, "shim-dependency", cls_name)]
    fn = tree.member(cls, method)
    return [Fact(memory.CONTRACT.id, symbol, "shim-dependency", "present" if fn is not None else "absent",
                 fn is not None, "shim-dependency-missing", tree.where(fn if fn is not None else cls))]


# -- C-kvlayout and C-blocksize: what EngineCore or the CPU attention kernels now require -------------------
CACHE_CONFIG = "vllm.config.cache"
LAYOUT_UNRESOLVED = "KV cache layout has not been resolved"
LAYOUT_RESOLVER = "vllm.v1.attention.backends.utils"
CPU_ATTENTION = ("vllm.v1.attention.backends.cpu_attn", "get_supported_kernel_block_sizes")


def kv_layout_resolution(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    f = tree.module_file(CACHE_CONFIG)
    if f is None:
        return [_not_found(kvlayout.CONTRACT.id, f"{CACHE_CONFIG}:CacheConfig", "layout", "vllm/config/cache.py")]
    lines = tree.string_lines(CACHE_CONFIG, LAYOUT_UNRESOLVED)
    resolver = tree.module_file(LAYOUT_RESOLVER)
    has_resolver = resolver is not None and "def resolve_kv_cache_layout" in resolver.read_text()
    return [Fact(kvlayout.CONTRACT.id, f"{CACHE_CONFIG}:CacheConfig.get_resolved_kv_cache_layout", "layout",
                 "must be resolved by EngineCore first" if lines else "no resolution step", not lines,
                 "layout-resolution-required", f"{f.relative_to(tree.root)}:{lines[0] if lines else 1}",
                 detail={"resolver_present": has_resolver})]


def cpu_kernel_block_sizes(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    module, method = CPU_ATTENTION
    f = tree.module_file(module)
    if f is None:
        return [Fact(blocksize.CONTRACT.id, f"{module}:{method}", "block-size", "no CPU attention backend", True)]
    node = next((n for n in ast.walk(_parse_file(f)) if isinstance(n, ast.FunctionDef) and n.name == method), None)
    if node is None:
        return [Fact(blocksize.CONTRACT.id, f"{module}:{method}", "block-size", "declares none", True, None,
                     f"{f.relative_to(tree.root)}:1")]
    ret = next((n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None), None)
    text = ast.unparse(ret.value) if ret is not None else "?"
    ints = [int(x) for x in re.findall(r"(?<![\w(])(\d+)(?![\w)])", text)]
    multiples = [int(x) for x in re.findall(r"MultipleOf\((\d+)\)", text)]
    takes_16 = blocksize.SPECULATORS_BLOCK_SIZE in ints or any(blocksize.SPECULATORS_BLOCK_SIZE % m == 0 for m in multiples)
    return [Fact(blocksize.CONTRACT.id, f"{module}:{method}", "block-size", text, takes_16, "block-size-unsupported",
                 f"{f.relative_to(tree.root)}:{node.lineno}", detail={"declared": text})]


def _parse_file(path):
    return ast.parse(path.read_text())


CHECKS = (rpc_return, two_phase, embed_method, prefix_caching, block_hashes, eagle3_support, kimi_stack_path,
          layer_calls, mla_platform, memory_budget, kv_layout_resolution, cpu_kernel_block_sizes)


def run_all(tree: Tree, used: UsedSurface, follower) -> list[Fact]:
    return [fact for check in CHECKS for fact in check(tree, used, follower)]
