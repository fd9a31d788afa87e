"""What a build's sources say about a model class, for predicting a new model's rows on builds no run observed yet.

Whether a row holds natively often depends on a fact of the model's own class in that build, not on what other
models did: C-eagle3 and the native export's `native-eagle3` hold where vLLM marks the class `SupportsEagle3`
(`supports_eagle3()` is an isinstance test). Most tiny models gained that mark in 0.17-0.18; Cohere, Gemma-3,
Granite and OLMo-2 never did, so "as most models moved" predicted them wrong. The mark is read from the build's
released sources (downloaded and cached like the gate's, `harness.envs.sources`), by the same base-class walk the
gate's C-eagle3 check uses (`Tree.base_names`): nothing imported, nothing guessed; None where the sources or the
class cannot be read."""

from __future__ import annotations

from functools import lru_cache

MARK = "SupportsEagle3"
#: Rows whose outcome follows the mark (the contracts that assume it).
MARKED_ROWS = ("eagle3", "native-eagle3")
MODELS_PACKAGE = "vllm.model_executor.models."


@lru_cache(maxsize=256)
def implements(version: str, architecture: str) -> bool | None:
    """Whether `architecture`'s class carries the mark in vLLM `version`'s sources; None where that cannot be read
    (no sdist, no such class)."""
    from harness.envs import sources
    from harness.vllm_source import tree as source_tree
    from harness.vllm_source.source_files import definitions

    try:
        root = sources.ensure(version).root
    except Exception:  # noqa: BLE001 - an unreadable build predicts by the other rules, saying so
        return None
    module, cls_name = registered(root, architecture) or (None, architecture)
    if module is None:
        module = next((m for m in definitions(str(root), architecture) if m.startswith(MODELS_PACKAGE)), None)
    if module is None:
        return None

    def check(tree) -> bool | None:
        cls = tree.lookup(f"{module}.{cls_name}")
        return None if cls is None or not cls.is_class else MARK in tree.base_names(cls)

    try:
        return source_tree.analyse(root, {module}, check)
    except source_tree.TreeError:
        return None


def registered(root, architecture: str) -> tuple[str, str] | None:
    """(module, class) vLLM's model registry maps the architecture to in these sources (`"Arch": ("module",
    "Class")` in registry.py: vLLM 0.32 maps Olmo2ForCausalLM to its transformers back end, for example)."""
    import re

    from harness.vllm_source.source_files import module_file

    f = module_file(root, "vllm.model_executor.models.registry")
    if f is None:
        return None
    found = re.search(rf'"{re.escape(architecture)}":\s*\(\s*"([\w.]+)",\s*"(\w+)"', f.read_text(encoding="utf-8"))
    return (MODELS_PACKAGE + found.group(1), found.group(2)) if found else None


def predicted(cid: str, outcome: str, export_here: bool, was: bool | None, now: bool | None) -> tuple[str, str] | None:
    """A marked row's outcome on a build where the mark is `now` (it was `was` where the row was observed as
    `outcome`; `export_here`: the build has vLLM's native export, some model's native-eagle3 row is not n/a there);
    None where the mark does not decide it and the other rules predict (unknown mark, a row it does not govern, a
    break of the model's own, a mark lost)."""
    if cid not in MARKED_ROWS or was is None or now is None:
        return None
    said = f"the class {'carries' if now else 'lacks'} {MARK} in this build's sources"
    if cid == "native-eagle3":  # the probe is supports_eagle3() on the class itself
        if not export_here:
            return None
        return ("native", said) if now else ("broken", said + " (the native export needs it)")
    if outcome == "broken":  # C-eagle3 broken for another reason (the generator did not start, the admission)
        return None
    if now == was:
        return outcome, f"{said}, as where it was observed: kept"
    return ("native", said + " (gained since)") if now else None
