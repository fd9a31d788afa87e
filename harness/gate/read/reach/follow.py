"""Following calls from a contract's entry points, per platform: what a path reaches, and whether it follows into
it (a role the path enters) or lists it as a step (a leaf)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from harness.gate.read.reach.index import Fn, Index
from harness.gate.read.reach.scope import ENGINE, EXECUTORS, NEVER_ENABLED, PLATFORMS, ROLES, SCHEDULER
from harness.vllm_source.indirection import decorators, getattr_call, is_property, self_reads


@dataclass
class Platform:
    name: str
    roles: dict[str, list[str]]  # role -> concrete classes
    #: A role class -> the subclasses vLLM constructs instead (whose overrides run): `instantiated_subclasses`.
    subclasses: dict[str, list[str]] = field(default_factory=dict)

    def role_of(self, index: Index, cls: str | None) -> str | None:
        """The role a class plays here: one of the role classes, a base of one, or a subclass vLLM runs instead."""
        if cls is None:
            return None
        for role, classes in self.roles.items():
            for c in classes:
                if cls == c or cls in self.subclasses.get(c, ()) or any(x.dotted == cls for x in index.mro(c)):
                    return role
        return None


def platform_roles(root: Path, index: Index) -> list[Platform]:
    from harness.vllm_source import runners

    out = []
    engines = instantiated_subclasses(index, ENGINE)
    for name, (module, cls) in PLATFORMS.items():
        read = runners.read(str(root), module)
        built = [r.path for r in read.defaults if index.cls(r.path) is not None]
        batch = sorted({t for r in built for t in [index.attr_type(r, "input_batch")] if t and index.cls(t)})
        out.append(
            Platform(
                name,
                {
                    "engine": [ENGINE],
                    "scheduler": [SCHEDULER],
                    "worker": [f"{module}.{cls}"],
                    "runner": built,
                    "executor": list(EXECUTORS),
                    "batch": batch,
                },
                {ENGINE: engines},
            )
        )
    return out


def _never_enabled(test: ast.AST) -> bool:
    text = ast.unparse(test)
    return any(s in text for s in NEVER_ENABLED)


def _calls(fn_node) -> list[ast.Call]:
    """The calls in a function, leaving out the branches a never-enabled feature guards."""
    found: list[ast.Call] = []

    def visit(node):
        if isinstance(node, ast.If) and _never_enabled(node.test):
            negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
            for child in node.body if negated else node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Call):
            found.append(node)
        for sub in ast.iter_child_nodes(node):
            visit(sub)

    for stmt in fn_node.body:
        visit(stmt)
    return found


def _rpc_name(call: ast.Call) -> str | None:
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "collective_rpc"):
        return None
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "method"), None)
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def instantiated_subclasses(index: Index, base: str) -> list[str]:
    """In-tree subclasses of `base` that vLLM constructs (a call of the class, outside a branch a never-enabled feature
    guards): the classes whose overrides run instead of `base`'s (EngineCoreProc, which the multiprocess engine
    runs, over EngineCore)."""
    found: set[str] = set()
    for fn in index.all_functions().values():
        if fn.node is None:
            continue
        module = fn.key.split(":")[0]
        for call in _calls(fn.node):
            if isinstance(call.func, ast.Name):
                cls = index.resolve_class(module, call.func.id)
                if cls and cls != base and any(c.dotted == base for c in index.mro(cls)):
                    found.add(cls)
    return sorted(found)


def _overrides(index: Index, platform: Platform, fn: Fn, concrete: str | None, via: str):
    """The overrides of `fn` in the subclasses of its concrete class that vLLM constructs instead (each with that
    subclass as `self`): a method overridden by the class that runs is on the path too. Constructors aside."""
    if concrete is None or "." not in fn.key.split(":")[1]:
        return
    name = fn.key.rsplit(".", 1)[1]
    if name == "__init__":  # the subclass's own process plumbing (EngineCoreProc: sockets, handshakes) around
        return  # the base's set-up, which it runs through super().__init__: not a step speculators replays
    for sub in platform.subclasses.get(concrete, ()):
        other = index.method(sub, name)
        if other is not None and other.key != fn.key:
            yield other, sub, f"{via} (run as {sub.rsplit('.', 1)[1]})"


def reachable(index: Index, platform: Platform, entries, enter: frozenset[str]) -> dict[str, tuple[Fn, str, bool]]:
    """Function key -> (function, how it was reached, followed) for what the entry points reach on `platform`;
    followed False: a step into a role the path does not enter (listed, not compared)."""
    seen: dict[str, tuple[Fn, str, bool]] = {}
    todo: list[tuple[Fn, str | None, str]] = []  # (function, concrete class of self, via)
    for role, name in entries:
        for cls_name in platform.roles.get(role, []):
            fn = index.method(cls_name, name)
            if fn is not None:
                todo.append((fn, cls_name, f"{role} {cls_name.rsplit('.', 1)[1]}.{name}"))
    modules = {c.rsplit(".", 1)[0] for role in enter for c in platform.roles.get(role, [])}
    visited: set[tuple[str, str | None]] = set()
    while todo:
        fn, concrete, via = todo.pop()
        if (fn.key, concrete) in visited:
            continue
        visited.add((fn.key, concrete))
        module = fn.key.split(":")[0]
        follow = (platform.role_of(index, concrete) in enter) if concrete else module in modules
        if fn.key not in seen or (follow and not seen[fn.key][2]):
            seen[fn.key] = (fn, via, follow)
        if not follow:
            continue
        qual = fn.key.split(":")[1]
        defining = f"{module}.{qual.rsplit('.', 1)[0]}" if "." in qual else None
        for target, cls in _targets(index, platform, fn, module, concrete, defining):
            todo.append((target, cls, fn.key))
        todo += list(_overrides(index, platform, fn, concrete, via))
    return seen


def _targets(index: Index, platform: Platform, fn: Fn, module: str, concrete: str | None, defining: str | None):
    """(function, the concrete class of its `self` or None) for each call in `fn` the path follows, and for what runs
    without a call naming it (harness.vllm_source.indirection): its decorators' bodies, a `getattr` call with a
    constant name, the properties it reads on `self`."""
    for deco in decorators(fn.node):
        yield from _found(
            (t, None) for t, _ in _name_calls(index, module, deco) if t is not None and t.node is not None
        )
    if concrete:
        for attr in dict.fromkeys(self_reads(fn.node)):
            prop = index.method(concrete, attr)
            if prop is not None and is_property(prop.node):
                yield prop, concrete
    constants = index.constants(module)
    for call in _calls(fn.node):
        rpc = _rpc_name(call)
        if rpc is not None:
            yield from _found((index.method(worker, rpc), worker) for worker in platform.roles["worker"])
        f = getattr_call(call, constants) or call.func
        if isinstance(f, ast.Attribute):
            yield from _found(_method_calls(index, platform, f, concrete, defining))
        elif isinstance(f, ast.Name):
            yield from _found(_name_calls(index, module, f.id))


def _found(pairs):
    return ((t, cls) for t, cls in pairs if t is not None)


def _is_name(node: ast.AST, *names: str) -> bool:
    return isinstance(node, ast.Name) and node.id in names


def _method_calls(index: Index, platform: Platform, f: ast.Attribute, concrete: str | None, defining: str | None):
    """`x.m()`, by what `x` is: self (the concrete class's MRO), super() (after the defining class), `self.<attr>`
    (its class, else its role's classes), or a local named like a role."""
    v = f.value
    if _is_name(v, "self", "cls"):
        if concrete:
            yield index.method(concrete, f.attr), concrete
    elif isinstance(v, ast.Call) and _is_name(v.func, "super"):
        if concrete and defining:
            yield index.method(concrete, f.attr, after=defining), concrete
    elif isinstance(v, ast.Attribute) and _is_name(v.value, "self"):
        if concrete:
            typed = index.attr_type(concrete, v.attr)
            classes = [typed] if typed and index.cls(typed) is not None else []
            classes += platform.roles.get(ROLES.get(v.attr, ""), [])
            for c in dict.fromkeys(classes):
                yield index.method(c, f.attr), c
    elif isinstance(v, ast.Name):  # executor.x() on a local named like a role, module.func()
        for c in platform.roles.get(ROLES.get(v.id, ""), []):
            yield index.method(c, f.attr), c


def _name_calls(index: Index, module: str, name: str):
    """`f()`: a class's constructor (`__init__`, `__post_init__`), else a function, through the module's imports."""
    cls = index.resolve_class(module, name)
    if cls is not None:
        for init in ("__init__", "__post_init__"):
            yield index.method(cls, init), cls
        return
    yield index.function(module, name), None
