"""EngineCore's set-up sequence, read from one version's sources by AST: the calls it makes between building
the executor and the first step (`EngineCore._initialize_kv_caches`).

speculators 0.3.0 replicates that set-up in its own generator (no EngineCore), so a step EngineCore adds
is a step speculators skips: vLLM 0.30 added the KV-cache layout resolution (C-kvlayout's shim replays it),
0.34 the extensible KV cache (`initialize_from_config` only reserves address space; EngineCore later commits
it with `finalize_extensible_kv_cache` + `executor.extend_kv_cache`). A step is a call on the executor (it acts
on the workers); calls of vLLM functions are read too (`Step.on_executor` False), as context: they compute the
plan speculators computes its own way (C-kvhelpers). Steps under a condition on a feature speculators' configuration never
enables (`NEVER_ENABLED`) are left out; every other condition is kept in the step's text.

A step is found wherever the set-up sends it: directly, through an EngineCore helper the method calls (`self.m()`,
followed into EngineCore's own methods, their conditions kept), or by name (`collective_rpc("name")` on the executor
or through EngineCore's own wrapper: the step is the worker method of that name).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

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
}


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
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS), None)
    fn = next((n for n in (cls.body if cls else ()) if isinstance(n, ast.FunctionDef) and n.name == METHOD), None)
    if cls is None or fn is None:
        return [], None
    imported = {k: v for k, v in imports_of(tree, MODULE).items() if v.startswith("vllm.")}
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found: list[Step] = []
    entered: set[str] = {METHOD}

    def by_name(call: ast.Call) -> str | None:
        arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "method"), None)
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None

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
        if isinstance(node, ast.Call):
            func = node.func
            when = " and ".join(conditions) or None
            receiver, attr = (ast.unparse(func.value), func.attr) if isinstance(func, ast.Attribute) else (None, None)
            name = by_name(node)
            if receiver in EXECUTOR_NAMES + ("self",) and attr == "collective_rpc" and name:
                found.append(Step(name, node.lineno, when, True))
            elif receiver in EXECUTOR_NAMES and attr:
                found.append(Step(attr, node.lineno, when, True))
            elif receiver == "self" and attr is not None and attr in methods and attr not in entered:
                entered.add(attr)  # an EngineCore helper: its steps are the set-up's, under this call's conditions
                for stmt in methods[attr].body:
                    visit(stmt, conditions)
            elif isinstance(func, ast.Name) and func.id in imported:
                found.append(Step(func.id, node.lineno, when, False))
        for sub in ast.iter_child_nodes(node):
            visit(sub, conditions)

    for stmt in fn.body:
        visit(stmt, ())
    return found, str(f.relative_to(root))
