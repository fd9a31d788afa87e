"""The static comparison: speculators' used vLLM surface, read in two versions' sources, fact by fact.

The harness's own shims are read the same way (`shim_surface`): what they import, call and read in vLLM.
Generic facts come from the surface fixture alone: every `module:Name` speculators imports (still
there? moved?), every call it makes into vLLM (each keyword it passes still taken? a new required
parameter it does not pass? too many positionals?) and every attribute it reads on a vLLM object.
Method calls and reads are followed through speculators' own bindings (`self.executor =
MultiprocExecutor(...)`) and vLLM's return annotations. Targeted facts (`checks`) read behaviour,
defaults and return shapes the surface cannot show. Each version is read on its own
(`version_facts`), in a worker process each so two versions load side by side; `compare` pairs them.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from harness.gate.read import contract_checks, coverage
from harness.vllm_source.calls import Ref, call_facts  # noqa: F401 - Ref is part of this module's vocabulary
from harness.vllm_source.facts import Fact, Finding
from harness.vllm_source.tree import Tree, TreeError, analyse
from harness.vllm_source.used_surface import UsedSurface


# -- following speculators' expressions into vLLM ------------------------------------------------------
class Follower:
    """Follows speculators' expressions (`self.executor.collective_rpc`) to what they reach in one vLLM."""

    def __init__(self, tree: Tree, used: UsedSurface, imports: dict[str, Fact]):
        self.tree, self.used, self.imports = tree, used, imports

    def expand(self, module: str, expr: str, depth: int = 0) -> str | None:
        """`expr` rewritten to start at an imported vLLM name (bound names replaced by their calls)."""
        parts = expr.split(".")
        for i in range(len(parts), 0, -1):
            callee = self.used.bindings[module].get(".".join(parts[:i]))
            if callee and depth < 8:
                return self.expand(module, ".".join([callee + "()", *parts[i:]]), depth + 1)
        return expr if parts[0].split("(")[0] in self.used.imports[module] else None

    def resolve_import(self, symbol: str):
        fact = self.imports.get(symbol)
        home = (fact.detail.get("moved_to") if fact else None) or symbol.split(":")[0]
        return self.tree.lookup(f"{home}.{symbol.split(':')[1]}")

    def follow(self, module: str, expr: str) -> Ref | None:
        expanded = self.expand(module, expr)
        if expanded is None:
            return None
        first, *rest = expanded.split(".")
        name = first.split("(")[0]
        ref = Ref(self.used.imports[module][name], "", self.resolve_import(self.used.imports[module][name]))
        self._calls(ref, first.count("()"))
        for token in rest:
            if ref.obj is None:
                return ref
            member = token.split("(")[0]
            owner = ref.obj
            found = self.tree.member(owner, member) if (owner.is_class or owner.is_module) else None
            ref.chain += "." + member
            ref.steps.append((ref.chain, owner, member, found))
            if found is None:
                ref.obj = None
                return ref
            ref.bound = ref.instance and found.is_function
            if found.is_attribute and ref.instance:
                ref.obj, ref.instance = self.tree.annotation_class(found), True
            else:
                ref.obj, ref.instance = found, False
            self._calls(ref, token.count("()"))
        return ref

    def _calls(self, ref: Ref, n: int) -> None:
        for _ in range(n):
            ref.chain += "()"
            obj = ref.obj
            if obj is None:
                return
            ref.bound = False
            if obj.is_class and not ref.instance:
                ref.instance = True
            elif obj.is_function:
                ref.obj, ref.instance = self.tree.returns_class(obj), True
            else:
                ref.obj = None


# -- generic facts -------------------------------------------------------------------------------------
def import_fact(tree: Tree, symbol: str) -> Fact:
    module, name = symbol.split(":")
    contract = coverage.owner(symbol, "")
    obj = tree.lookup(f"{module}.{name}")
    if obj is not None:
        return Fact(contract, symbol, "import", "importable", True, evidence=tree.where(obj))
    if not tree.settled:
        return Fact(contract, symbol, "import", "pending", None)
    homes = [m for m in tree.find_definitions(name) if m != module]
    if not homes:
        return Fact(contract, symbol, "import", "absent", False, "import-removed", evidence=_module_where(tree, module))
    best = max(homes, key=lambda m: (len(os.path.commonprefix([m, module])), -len(m)))
    moved = tree.lookup(f"{best}.{name}")
    return Fact(
        contract,
        symbol,
        "import",
        f"only in {best}",
        False,
        "import-moved",
        evidence=tree.where(moved) if moved is not None else _module_where(tree, best),
        detail={"moved_to": best, "name": name, "candidates": homes},
    )


def _module_where(tree: Tree, module: str) -> str:
    f = tree.module_file(module)
    return f"{f.relative_to(tree.root)}:1" if f else f"{module.replace('.', '/')} (no such module)"


def surface_facts(tree: Tree, used: UsedSurface) -> tuple[list[Fact], Follower]:
    imports = {s: import_fact(tree, s) for s in used.imported_symbols()}
    follower = Follower(tree, used, imports)
    facts = list(imports.values())
    for call in used.calls:
        ref = follower.follow(call.module, call.callee)
        if (
            ref is None
            or ref.obj is None
            or not (ref.obj.is_class or ref.obj.is_function)
            or (ref.obj.is_class and ref.instance)
        ):
            continue
        facts += call_facts(tree, ref, call, coverage.owner(ref.head, ref.chain))
    for module, reads in used.attributes.items():
        for read in reads:
            ref = follower.follow(module, read)
            if ref is None:
                continue
            for chain, owner, member, found in ref.steps:
                contract = coverage.owner(ref.head, chain)
                symbol = ref.head + chain
                if found is not None:
                    facts.append(Fact(contract, symbol, "attribute", "present", True, evidence=tree.where(found)))
                else:
                    facts.append(
                        Fact(
                            contract,
                            symbol,
                            "attribute",
                            "absent",
                            False,
                            "attribute-removed",
                            evidence=tree.where(owner),
                            detail={"member": member},
                        )
                    )
    return facts, follower


def version_facts(root: str, fixture: str) -> list[Fact]:
    """Every fact of one version (run in a worker process: griffe and the AST stay there)."""
    from harness.vllm_source import shim_surface
    from harness.vllm_source.used_surface import load

    used = load(path=Path(fixture))
    ours = shim_surface.load()

    def read(tree: Tree) -> list[Fact]:
        facts, follower = surface_facts(tree, used)
        facts += contract_checks.run_all(tree, used, follower)
        facts += shim_surface.facts(tree, ours)
        return _unique(facts)

    return analyse(Path(root), contract_checks.seed_modules(used), read)


def _unique(facts: list[Fact]) -> list[Fact]:
    seen: dict[tuple, Fact] = {}
    for f in facts:
        seen.setdefault(f.key, f)
    return list(seen.values())


def read_versions(roots: list[Path], fixture: Path, parallel: bool = True) -> list[list[Fact]]:
    """Facts for each version's sources, read side by side in worker processes."""
    if not parallel or len(roots) == 1:
        return [version_facts(str(r), str(fixture)) for r in roots]
    with ProcessPoolExecutor(max_workers=len(roots)) as pool:
        return list(pool.map(version_facts, [str(r) for r in roots], [str(fixture)] * len(roots)))


# -- comparing two versions ------------------------------------------------------------------------------
@dataclass
class Comparison:
    findings: list[Finding] = field(default_factory=list)  # changed, and speculators' assumption fails now
    carried: list[Finding] = field(default_factory=list)  # failed already in the old version, unchanged
    restored: list[Finding] = field(default_factory=list)  # failed in the old version, holds now
    not_checked: dict[str, list[str]] = field(default_factory=dict)  # contract -> why
    checked: dict[str, int] = field(default_factory=dict)  # contract -> facts compared


def compare(old: list[Fact], new: list[Fact]) -> Comparison:
    out = Comparison()
    before = {f.key: f for f in old}
    for n in new:
        o = before.get(n.key)
        if n.holds is None or (o is not None and o.holds is None):
            why = n if n.holds is None or o is None else o
            out.not_checked.setdefault(n.contract, []).append(f"{why.symbol}: {why.value}")
            continue
        out.checked[n.contract] = out.checked.get(n.contract, 0) + 1
        if n.holds:
            if o is not None and o.holds is False:
                out.restored.append(Finding.between(o, n))
        elif o is None or o.holds or o.value != n.value:
            out.findings.append(Finding.between(o, n))
        else:
            out.carried.append(Finding.between(o, n))
    for o in old:
        if o.holds is None and o.key not in {n.key for n in new}:
            out.not_checked.setdefault(o.contract, []).append(f"{o.symbol}: {o.value} (old version)")
    return out


__all__ = ["Comparison", "TreeError", "compare", "read_versions", "version_facts"]
