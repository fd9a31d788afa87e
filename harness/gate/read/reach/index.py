"""One release's functions and classes in the watched packages, read from its sources (cached by file digest), with
the lookups the path follower needs: a class's MRO, a method after a class, an attribute's class, a module's
function or class through its imports."""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.gate.read.reach.scope import PACKAGES
from harness.vllm_source.indirection import module_constants
from harness.vllm_source.source_files import module_of


@dataclass
class Fn:
    key: str  # module:Class.name or module:name
    file: str
    line: int
    end: int
    text: str  # the source without docstrings, as the AST prints it
    signature: tuple  # (name, has default) per parameter, *args and **kwargs marked
    body: str  # digest of the body without docstrings
    node: Any = field(repr=False, compare=False, default=None)  # its def node


@dataclass
class ClassInfo:
    dotted: str
    bases: list[str]
    methods: dict[str, Fn]
    attr_types: dict[str, str]  # self.<attr> -> dotted class (assigned Cls(...) or annotated)


def _strip_docstrings(node: ast.AST) -> ast.AST:
    for n in ast.walk(node):
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) or not n.body:
            continue
        first = n.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            n.body = n.body[1:] or [ast.Pass()]
    return node


def _signature(fn) -> tuple:
    """(name, has a default, kind) per parameter; kind "p" positional, "k" keyword-only, "*" and "**"."""
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [False] * (len(pos) - len(a.defaults)) + [True] * len(a.defaults)
    sig = [(p.arg, d, "p") for p, d in zip(pos, defaults, strict=True)]
    sig += [(a.vararg.arg, True, "*")] if a.vararg else []
    sig += [(p.arg, d is not None, "k") for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    sig += [(a.kwarg.arg, True, "**")] if a.kwarg else []
    return tuple(sig)


def _fn(module: str, qual: str, node, rel: str) -> Fn:
    import copy

    clean: Any = _strip_docstrings(copy.deepcopy(node))
    parts = [ast.dump(d) for d in clean.decorator_list] + [ast.dump(s) for s in clean.body]
    if getattr(clean, "returns", None) is not None:
        parts.append(ast.dump(clean.returns))
    body = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return Fn(
        f"{module}:{qual}",
        rel,
        node.lineno,
        getattr(node, "end_lineno", node.lineno),
        ast.unparse(clean),
        _signature(node),
        body,
        node,
    )


@dataclass
class Module:
    name: str
    imports: dict[str, str]
    classes: dict[str, ClassInfo]
    functions: dict[str, Fn]
    constants: dict[str, str] = field(default_factory=dict)  # NAME = "text" at module level (getattr names)


@lru_cache(maxsize=4096)
def _read_module(path: str, digest: str, root: str) -> Module:
    """One module's classes, functions and imports (cached by content: the mutants share all but one file)."""
    from harness.vllm_source.runners import imports_of

    rel = str(Path(path).relative_to(root))
    name = module_of(rel)
    tree = ast.parse(Path(path).read_text(encoding="utf-8-sig"))
    imports = imports_of(tree, name)
    classes: dict[str, ClassInfo] = {}
    functions: dict[str, Fn] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[node.name] = _fn(name, node.name, node, rel)
        elif isinstance(node, ast.ClassDef):
            bases = []
            for b in node.bases:
                dotted = ast.unparse(b)
                head = dotted.split(".")[0]
                bases.append(imports[head] + dotted[len(head) :] if head in imports else f"{name}.{dotted}")
            methods = {
                n.name: _fn(name, f"{node.name}.{n.name}", n, rel)
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
            classes[node.name] = ClassInfo(f"{name}.{node.name}", bases, methods, _attr_types(node, imports, name))
    return Module(name, imports, classes, functions, module_constants(tree))


def _attr_types(cls: ast.ClassDef, imports: dict[str, str], module: str) -> dict[str, str]:
    def dotted(expr) -> str | None:
        text = ast.unparse(expr).strip("'\"")
        text = text.split("[")[0].split("|")[0].strip()
        head = text.split(".")[0]
        if head in imports:
            return imports[head] + text[len(head) :]
        return None

    out: dict[str, str] = {}
    for n in ast.walk(cls):
        if (
            isinstance(n, ast.AnnAssign)
            and isinstance(n.target, ast.Attribute)
            and getattr(n.target.value, "id", None) == "self"
        ):
            d = dotted(n.annotation)
            if d:
                out.setdefault(n.target.attr, d)
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Call):
            for t in n.targets:
                if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) == "self":
                    d = dotted(n.value.func)
                    if d:
                        out.setdefault(t.attr, d)
    return out


class Index:
    """The watched packages of one version's sources."""

    def __init__(self, root: Path):
        self.root = Path(root).absolute()
        self.modules: dict[str, Module] = {}
        for pkg in PACKAGES:
            base = self.root / pkg
            files = [base] if base.suffix == ".py" else sorted(base.rglob("*.py")) if base.is_dir() else []
            for f in files:
                if not f.is_file():
                    continue
                data = f.read_bytes()
                try:
                    m = _read_module(str(f), hashlib.sha256(data).hexdigest(), str(self.root))
                except SyntaxError:
                    continue
                self.modules[m.name] = m

    def cls(self, dotted: str) -> ClassInfo | None:
        module, _, name = dotted.rpartition(".")
        m = self.modules.get(module)
        if m is not None and name in m.classes:
            return m.classes[name]
        if m is not None and name in m.imports:  # re-exported
            target = m.imports[name]
            return self.cls(target) if target != dotted else None
        return None

    def mro(self, dotted: str, _seen=None) -> list[ClassInfo]:
        seen = _seen if _seen is not None else set()
        c = self.cls(dotted)
        if c is None or c.dotted in seen:
            return []
        seen.add(c.dotted)
        out = [c]
        for b in c.bases:
            out += [x for x in self.mro(b, seen) if x not in out]
        return out

    def method(self, concrete: str, name: str, after: str | None = None) -> Fn | None:
        chain = self.mro(concrete)
        if after is not None:
            idx = next((i for i, c in enumerate(chain) if c.dotted == after), None)
            chain = chain[idx + 1 :] if idx is not None else []
        for c in chain:
            if name in c.methods:
                return c.methods[name]
        return None

    def attr_type(self, concrete: str, attr: str) -> str | None:
        for c in self.mro(concrete):
            if attr in c.attr_types:
                return c.attr_types[attr]
        return None

    def function(self, module: str, name: str) -> Fn | None:
        m = self.modules.get(module)
        if m is None:
            return None
        if name in m.functions:
            return m.functions[name]
        target = m.imports.get(name)
        if target:
            mod, _, fname = target.rpartition(".")
            if mod != module and mod in self.modules:
                return self.function(mod, fname)
        return None

    def constants(self, module: str) -> dict[str, str]:
        m = self.modules.get(module)
        return m.constants if m is not None else {}

    def resolve_class(self, module: str, name: str) -> str | None:
        m = self.modules.get(module)
        if m is None:
            return None
        if name in m.classes:
            return m.classes[name].dotted
        target = m.imports.get(name)
        return target if target and self.cls(target) is not None else None

    def all_functions(self) -> dict[str, Fn]:
        out = {}
        for m in self.modules.values():
            out.update({f.key: f for f in m.functions.values()})
            for c in m.classes.values():
                out.update({f.key: f for f in c.methods.values()})
        return out
