"""EngineCore's set-up sequence, read from one version's sources by AST: the calls it makes between building
the executor and the first step (`EngineCore._initialize_kv_caches`).

speculators 0.3.0 replicates that set-up in its own generator (no EngineCore), so a step EngineCore adds
is a step speculators skips: vLLM 0.30 added the KV-cache layout resolution (C-kvlayout's shim replays it),
0.34 the extensible KV cache (`initialize_from_config` only reserves address space; EngineCore later commits
it with `finalize_extensible_kv_cache` + `executor.extend_kv_cache`). A step is a call on the executor (it acts
on the workers); calls of vLLM functions are read too (`Step.on_executor` False), as context: they compute the
plan speculators computes its own way (C-kvhelpers). Steps under a condition on a feature speculators' configuration never
enables (`NEVER_ENABLED`) are left out; every other condition is kept in the step's text.

The set-up is read from the class vLLM runs: EngineCore, or the subclass its module constructs (EngineCoreProc, the
multiprocess engine: an override of `_initialize_kv_caches` or a helper there runs instead of EngineCore's, and its
`super()` call runs EngineCore's). A step is found wherever the set-up sends it: directly, through a helper the
method calls (`self.m()`, followed into the running class's methods, their conditions kept), or by name (`collective_rpc("name")` on the executor
or through EngineCore's own wrapper: the step is the worker method of that name), and through the indirections of
`harness.vllm_source.indirection`: a decorator on a method the set-up runs (its body), a mixin or other base class
of the running classes (this module's, or one imported from vLLM), `getattr(self, "name")()` with a constant name, and
a property the set-up reads.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from harness.vllm_source.indirection import decorators, getattr_call, is_property, module_constants
from harness.vllm_source.runners import imports_of
from harness.vllm_source.source_files import module_file, parse

MODULE = "vllm.v1.engine.core"
CLASS = "EngineCore"
METHOD = "_initialize_kv_caches"
#: Names the executor goes by in that method.
EXECUTOR_NAMES = ("self.model_executor", "executor")
#: Text in an `if` test for a feature speculators' configuration never turns on (it builds its VllmConfig itself).
NEVER_ENABLED = {
    "kv_transfer_config": "KV transfer connectors (disaggregated prefill, CPU offload)",
    "ec_transfer_config": "encoder-cache transfer",
    "VLLM_ELASTIC_EP": "elastic expert parallelism",
    "is_elastic_ep": "elastic expert parallelism",
    "data_parallel": "data parallelism (one engine per data-parallel rank)",
}


def running_chain(tree: ast.Module, classes: dict) -> list[str]:
    """EngineCore, then the subclass in its module that vLLM constructs to run it (EngineCoreProc: the multiprocess
    engine), its own bases between: the methods that run are the last one's, else the ones before. A construction
    a never-enabled feature guards (DPEngineCoreProc, data parallelism) does not count."""

    def derives(name: str, seen=frozenset()) -> bool:
        node = classes.get(name)
        if node is None or name in seen:
            return False
        bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
        return CLASS in bases or any(derives(b, seen | {name}) for b in bases)

    built: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and any(s in ast.unparse(node.test) for s in NEVER_ENABLED):
            negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
            for branch in node.body if negated else node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and derives(node.func.id):
            built.append(node.func.id)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    if not built:
        return [CLASS]
    running, chain = built[0], list[str]()
    while running and running != CLASS:
        chain.insert(0, running)
        node = classes[running]
        running = next((b.id for b in node.bases if isinstance(b, ast.Name) and (b.id == CLASS or derives(b.id))), "")
    return [CLASS, *chain]


def _methods(chain: list) -> dict:
    """Method name -> the definition that runs (the most derived class in `chain` that defines it)."""
    out: dict = {}
    for node in chain:
        out.update({n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})
    return out


def _base_class(root: Path, classes: dict, imported: dict, name: str):
    """A base class named in this module: defined here, or imported from a vLLM module (read from its file)."""
    if name in classes:
        return classes[name]
    target = imported.get(name)
    f = module_file(Path(root), target.rpartition(".")[0]) if target else None
    if f is None or target is None:
        return None
    return next(
        (n for n in parse(str(f)).body if isinstance(n, ast.ClassDef) and n.name == target.rpartition(".")[2]), None
    )


def with_bases(root: Path, chain: list, classes: dict, imported: dict) -> list:
    """`chain` (EngineCore, then what runs it) with the other bases of each class before it, most basic first: a
    mixin's method runs where no class of the chain overrides it."""
    out: list = []
    for node in chain:
        for b in reversed(node.bases):
            base = _base_class(root, classes, imported, b.id) if isinstance(b, ast.Name) else None
            if base is not None and base not in chain and base not in out:
                out.append(base)
        out.append(node)
    return out


def _helper(chain: list, methods: dict, receiver: str | None, attr: str | None, call: ast.Call):
    """The method a `self.m()` or `super().m()` call in the set-up runs, or None (super(): the base's, EngineCore's
    own definition of it)."""
    if attr is None:
        return None
    if receiver == "self":
        return methods.get(attr)
    if receiver == "super()":
        base = chain[0]  # EngineCore: the set-up a subclass's override extends
        return next((n for n in base.body if isinstance(n, ast.FunctionDef) and n.name == attr), None)
    return None


@dataclass(frozen=True)
class Step:
    name: str  # the executor method or vLLM function called
    line: int
    condition: str | None  # the `if` tests it sits under, joined (None: unconditional)
    on_executor: bool

    def describe(self) -> str:
        call = f"executor.{self.name}()" if self.on_executor else f"{self.name}()"
        return call + (f" when {self.condition}" if self.condition else "")


def steps(root: Path) -> tuple[list[Step], str | None]:
    """The set-up steps in source order and the file they were read from (None: the method is not there)."""
    f = module_file(Path(root), MODULE)
    if f is None:
        return [], None
    tree = parse(str(f))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    cls = classes.get(CLASS)
    imported = {k: v for k, v in imports_of(tree, MODULE).items() if v.startswith("vllm.")}
    chain = [classes[c] for c in running_chain(tree, classes)] if cls is not None else []
    methods = _methods(with_bases(root, chain, classes, imported))
    fn = methods.get(METHOD)
    if cls is None or fn is None:
        return [], None
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    constants = module_constants(tree)
    found: list[Step] = []
    entered: set[int] = set()

    def by_name(call: ast.Call) -> str | None:
        arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "method"), None)
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None

    def enter(method, conditions: tuple[str, ...]) -> None:
        """A method's steps, and those of the decorators this module defines for it, under the caller's conditions."""
        if id(method) in entered:
            return
        entered.add(id(method))
        for body in [functions[d].body for d in decorators(method) if d in functions] + [method.body]:
            for stmt in body:
                visit(stmt, conditions)

    def visit(node, conditions: tuple[str, ...]) -> None:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if any(s in test for s in NEVER_ENABLED):
                # Only the branch taken with that feature off runs for speculators, and always does.
                negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
                for child in node.body if negated else node.orelse:
                    visit(child, conditions)
                return
            for child in node.body:
                visit(child, conditions + (test,))
            for child in node.orelse:
                visit(child, conditions + (f"not ({test})",))
            return
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self" and isinstance(node.ctx, ast.Load):
            prop = methods.get(node.attr)
            if prop is not None and is_property(prop):  # reading it runs it
                enter(prop, conditions)
        if isinstance(node, ast.Call):
            func = getattr_call(node, constants) or node.func
            when = " and ".join(conditions) or None
            receiver, attr = (ast.unparse(func.value), func.attr) if isinstance(func, ast.Attribute) else (None, None)
            name = by_name(node)
            if receiver in EXECUTOR_NAMES + ("self",) and attr == "collective_rpc" and name:
                found.append(Step(name, node.lineno, when, True))
            elif receiver in EXECUTOR_NAMES and attr:
                found.append(Step(attr, node.lineno, when, True))
            elif (helper := _helper(chain, methods, receiver, attr, node)) is not None:
                enter(helper, conditions)  # an EngineCore helper (or the base's, through super()): its steps are
                # the set-up's, under this call's conditions
            elif isinstance(func, ast.Name) and func.id in imported:
                found.append(Step(func.id, node.lineno, when, False))
        for sub in ast.iter_child_nodes(node):
            visit(sub, conditions)

    enter(fn, ())
    return found, str(f.relative_to(root))
