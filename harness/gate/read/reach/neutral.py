"""Edits that cannot change a value speculators reads, classified by rule: a changed function on a watched path whose
two bodies are the same program up to

* **local names**: the bodies are equal once every local name (bound in the function, not a parameter, not declared
  `global`/`nonlocal`) is renamed by its order of first appearance, so a consistent renaming is neutral and a
  rename that changes which binding a name refers to is not (a local renamed to shadow a global reads another
  value);
* **logging calls**: a statement `<logger>.<level>(...)` (debug, info, warning, error, exception, critical, log and
  their `_once` forms) on a name the module binds at its top level and whose name says it logs, with arguments
  that call nothing and assign nothing (a log line whose argument pops a queue is not neutral); an `if` left empty
  by removing such lines, whose test calls nothing, goes with them;
* **type annotations**: of parameters, returns and local variables (`x: T = v` is `x = v`; a bare `x: T` binds
  nothing).

Nothing else is: an edit the rule does not know stays `changed` (REVIEW, or decided by running the candidate). Each
neutral change says which of the three made it so (`why`), and is listed in the report, never dropped.
"""

from __future__ import annotations

import ast
import copy
from itertools import combinations
from typing import Any

LOG_METHODS = frozenset(
    {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}
    | {f"{m}_once" for m in ("debug", "info", "warning")}
)


def module_names(tree: ast.Module) -> frozenset[str]:
    """Names a module binds at its top level (assignments, imports, defs)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
    return frozenset(out)


def _pure(node: ast.AST) -> bool:
    """Calls nothing, assigns nothing, awaits and yields nothing."""
    return not any(
        isinstance(n, (ast.Call, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)) for n in ast.walk(node)
    )


def _is_log_line(stmt: ast.stmt, loggers: frozenset[str]) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in LOG_METHODS
        and isinstance(func.value, ast.Name)
        and func.value.id in loggers
        and "log" in func.value.id.lower()
        and all(_pure(a) for a in call.args)
        and all(_pure(k.value) for k in call.keywords)
    )


class _WithoutLogs(ast.NodeTransformer):
    def __init__(self, loggers: frozenset[str]):
        self.loggers = loggers

    def generic_visit(self, node):
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                kept = [s for s in stmts if not _is_log_line(s, self.loggers) and not _emptied_if(s)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
        return node


def _emptied_if(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.If)
        and not stmt.orelse
        and all(isinstance(s, ast.Pass) for s in stmt.body)
        and _pure(stmt.test)
    )


class _WithoutAnnotations(ast.NodeTransformer):
    def visit_arg(self, node):
        node.annotation = None
        return node

    def visit_FunctionDef(self, node):
        node.returns = None
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node):
        if node.value is None:
            return None
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)


def _locals(fn) -> list[str]:
    """Names bound in `fn`'s body that are neither parameters nor declared global/nonlocal, in order of first
    binding."""
    params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    declared = {n for s in ast.walk(fn) if isinstance(s, (ast.Global, ast.Nonlocal)) for n in s.names}
    seen: list[str] = []
    for node in ast.walk(fn):
        if node is fn:
            continue
        name = None
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            name = node.id
        elif (
            isinstance(node, ast.ExceptHandler)
            and node.name
            or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ):
            name = node.name
        elif isinstance(node, ast.alias):
            name = (node.asname or node.name).split(".")[0]
        if name and name not in params and name not in declared and name not in seen:
            seen.append(name)
    return seen


class _Renamed(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str], root: ast.AST):
        self.mapping = mapping
        self.root = root  # the function renamed: its own name is not a local

    def visit_Name(self, node):
        node.id = self.mapping.get(node.id, node.id)
        return node

    def visit_ExceptHandler(self, node):
        if node.name:
            node.name = self.mapping.get(node.name, node.name)
        self.generic_visit(node)
        return node

    def visit_alias(self, node):
        if node.asname:
            node.asname = self.mapping.get(node.asname, node.asname)
        return node

    def _defined(self, node):
        if node is not self.root:
            node.name = self.mapping.get(node.name, node.name)
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _defined


def _renamed_locals(fn):
    mapping = {name: f"_local_{i}" for i, name in enumerate(_locals(fn))}
    return _Renamed(mapping, fn).visit(fn)


STEPS = (
    ("type annotations", lambda fn, loggers: _WithoutAnnotations().visit(fn)),
    ("logging calls", lambda fn, loggers: _WithoutLogs(loggers).visit(fn)),
    ("local names", lambda fn, loggers: _renamed_locals(fn)),
)


def _canonical(fn, steps, loggers: frozenset[str]) -> str:
    from harness.gate.read.reach.index import _strip_docstrings

    node: Any = _strip_docstrings(copy.deepcopy(fn))
    node.name = "_"
    for _, step in steps:
        node = step(node, loggers)
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def neutral(old_fn, new_fn, old_loggers: frozenset[str], new_loggers: frozenset[str]) -> str | None:
    """Why two versions of a function are the same program up to neutral edits (the fewest of the rule's three
    that make them equal), or None."""
    if old_fn is None or new_fn is None:
        return None
    for size in range(1, len(STEPS) + 1):
        for chosen in combinations(STEPS, size):
            if _canonical(old_fn, chosen, old_loggers) == _canonical(new_fn, chosen, new_loggers):
                return "neutral: only " + " and ".join(name for name, _ in chosen) + " differ"
    return None
