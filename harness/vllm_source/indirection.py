"""The ways a call reaches code without naming it at the call site, read by AST: a decorator (its body runs around
the decorated function), `getattr(obj, "name")(...)` with a constant or module-constant name, and a property (an
attribute read that runs a method). The gate's path follower (harness.gate.read.reach.follow) and EngineCore's
set-up reader (harness.vllm_source.engine_setup) follow these like `self.m()`: a step moved behind one still runs,
so it must still be seen (docs/gate.md, "Indirections")."""

from __future__ import annotations

import ast

#: Decorator names that make a method a property: reading the attribute runs it.
PROPERTY_DECORATORS = ("property", "cached_property")


def module_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = "text"` bindings: the names a `getattr(obj, NAME)` may use."""
    out: dict[str, str] = {}
    for n in tree.body:
        if not isinstance(n, (ast.Assign, ast.AnnAssign)):
            continue
        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
        value = n.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return out


def getattr_call(call: ast.Call, constants: dict[str, str]) -> ast.Attribute | None:
    """`getattr(obj, "m")(...)` as the attribute `obj.m` it calls, where the name is a constant or a module
    constant; None for any other call."""
    f = call.func
    if not (isinstance(f, ast.Call) and isinstance(f.func, ast.Name) and f.func.id == "getattr" and len(f.args) >= 2):
        return None
    name = f.args[1]
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        attr = name.value
    elif isinstance(name, ast.Name) and name.id in constants:
        attr = constants[name.id]
    else:
        return None
    return ast.copy_location(ast.Attribute(value=f.args[0], attr=attr, ctx=ast.Load()), f)


def decorators(fn) -> list[str]:
    """The plain names a function is decorated with (`@name` or `@name(...)`): those a module may define."""
    out = []
    for d in getattr(fn, "decorator_list", ()):
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name):
            out.append(target.id)
    return out


def is_property(fn) -> bool:
    """Whether reading the method's name on an object runs it (`@property`, `@cached_property`, either spelled
    through a module: `@functools.cached_property`)."""
    for d in getattr(fn, "decorator_list", ()):
        name = d.attr if isinstance(d, ast.Attribute) else d.id if isinstance(d, ast.Name) else ""
        if name in PROPERTY_DECORATORS:
            return True
    return False


def self_reads(node: ast.AST) -> list[str]:
    """The attribute names read on `self` in `node` (`self.x` loaded, not called: a call is a method call)."""
    called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return [
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.ctx, ast.Load)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and id(n) not in called
    ]
