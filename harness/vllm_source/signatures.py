"""What a call into vLLM must pass, read from the sources: the parameters of a function, a method or a class's
constructor (its `__init__`, or the fields of a dataclass, pydantic dataclass, vLLM `@config` class or msgspec
Struct). The gate compares these against the calls speculators and the shims make."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the contracts import this module at run time, where griffe (the tree's loader) may be absent
    from harness.vllm_source.tree import Tree

#: Decorators and bases whose classes are constructed from their annotated fields.
DATACLASS_DECORATORS = ("dataclass", "config", "dataclass_transform")
STRUCT_BASES = ("Struct", "BaseModel")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "positional-only" | "positional" | "keyword-only" | "*args" | "**kwargs"
    required: bool
    line: int | None


@dataclass(frozen=True)
class Signature:
    params: tuple[Param, ...]
    where: str  # file:line of the def (or class, for a dataclass-like constructor)
    fn: Any = field(default=None, compare=False)  # the griffe function read (its body: harness.vllm_source.kwargs_fate)

    def named(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name and p.kind not in ("*args", "**kwargs")), None)

    @property
    def takes_any_keyword(self) -> bool:
        return any(p.kind == "**kwargs" for p in self.params)

    @property
    def positional(self) -> list[Param]:
        return [p for p in self.params if p.kind in ("positional-only", "positional")]

    @property
    def takes_any_positional(self) -> bool:
        return any(p.kind == "*args" for p in self.params)


def signature(tree: Tree, obj, bound: bool) -> Signature | None:
    """Parameters a call must satisfy; `bound`: called on an instance (self is not passed)."""
    obj = tree.final(obj)
    if obj is None:
        return None
    if obj.is_function:
        return _function_signature(tree, obj, bound)
    if obj.is_class:
        init = tree.member(obj, "__init__")
        if init is not None and init.is_function:
            return _function_signature(tree, init, True)
        if _dataclass_like(tree, obj):
            return _field_signature(tree, obj)
        if not obj.bases:
            return Signature((), tree.where(obj))
    return None


def _function_signature(tree: Tree, fn, bound: bool) -> Signature:
    node = tree.node(fn)
    lines = {a.arg: a.lineno for a in ast.walk(node) if isinstance(a, ast.arg)} if node else {}
    kinds = {
        "positional-only": "positional-only",
        "positional or keyword": "positional",
        "keyword-only": "keyword-only",
        "variadic positional": "*args",
        "variadic keyword": "**kwargs",
    }
    params = [
        Param(
            p.name,
            kinds[p.kind.value],
            p.default is None and p.kind.value not in ("variadic positional", "variadic keyword"),
            lines.get(p.name),
        )
        for p in fn.parameters
    ]
    is_method = fn.parent is not None and fn.parent.is_class and "staticmethod" not in fn.labels
    drops_first = bound or "classmethod" in fn.labels or fn.name == "__init__"
    if drops_first and is_method and params and params[0].kind in ("positional-only", "positional"):
        params = params[1:]
    return Signature(tuple(params), tree.where(fn), fn)


def _dataclass_like(tree: Tree, cls) -> bool:
    decorators = {str(d.value).split("(")[0].rsplit(".", 1)[-1] for d in cls.decorators}
    return (
        bool(decorators & set(DATACLASS_DECORATORS))
        or "dataclass" in cls.labels
        or bool(tree.base_names(cls) & set(STRUCT_BASES))
    )


def _field_signature(tree: Tree, cls) -> Signature:
    """Constructor of a dataclass, pydantic dataclass, vLLM @config class or msgspec Struct: its fields.

    Read from the class bodies (bases first), not from griffe's members: griffe leaves
    `InitVar` pseudo-fields out, and those are exactly what a constructor call must pass.
    """
    fields: dict[str, Param] = {}
    for klass in [*reversed(tree.bases(cls)), cls]:
        node = tree.node(klass)
        for stmt in node.body if node else ():
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            annotation = ast.unparse(stmt.annotation)
            value = ast.unparse(stmt.value) if stmt.value is not None else None
            if "ClassVar" in annotation or (value and "init=False" in value):
                continue
            fields[stmt.target.id] = Param(stmt.target.id, "keyword-only", value is None, stmt.lineno)
    return Signature(tuple(fields.values()), tree.where(cls))
