"""A static view of one vLLM version's sources: griffe loads only the modules the checks ask for.

Loading all of vLLM with griffe takes 5 s (0.11) to 26 s (0.33) per version; the gate needs a few
dozen modules. So griffe loads a *farm*: a temporary folder of links to the wanted modules (and
their packages' `__init__.py`). A lookup that needs a module not loaded yet (an alias target, a
wildcard import, a base class) records it in `requested` and answers None; `analyse()` reruns the
checks with the larger set until nothing new is asked for, so every answer comes from the modules
that really define the names. Nothing is imported and no alias resolution is guessed.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import griffe

from harness.vllm_source.source_files import PACKAGE, READ, definitions, module_file, parse

MAX_ROUNDS = 15
T = TypeVar("T")


class TreeError(RuntimeError):
    """The sources could not be read the way the checks need (the gate cannot decide)."""


class Tree:
    """One version's sources with the `wanted` modules loaded by griffe; asks for more via `requested`."""

    def __init__(self, root: Path, wanted: set[str]):
        self.root = Path(root).absolute()  # the farm's links point here: relative targets would dangle
        self.wanted = set(wanted)
        self.requested: set[str] = set()
        self._farm = Path(tempfile.mkdtemp(prefix="harness-gate-farm-"))
        try:
            for module in sorted(self.wanted):
                for f in self._files(module):
                    link = self._farm / f.relative_to(self.root)
                    READ["files"].add(str(f.resolve()))
                    if not link.exists():
                        link.parent.mkdir(parents=True, exist_ok=True)
                        os.symlink(f, link)
            self.top = griffe.load(
                PACKAGE,
                search_paths=[self._farm],
                modules_collection=griffe.ModulesCollection(),
                lines_collection=griffe.LinesCollection(),
                allow_inspection=False,
                resolve_aliases=False,
            )
        except (griffe.LoadingError, SyntaxError, OSError, ModuleNotFoundError) as exc:
            self.close()
            raise TreeError(f"griffe could not load {self.root}: {exc}") from exc

    def close(self) -> None:
        shutil.rmtree(self._farm, ignore_errors=True)

    # -- files and modules ------------------------------------------------------------------------
    def module_file(self, module: str) -> Path | None:
        return module_file(self.root, module)

    def _files(self, module: str) -> list[Path]:
        parts = module.split(".")
        return [f for i in range(1, len(parts) + 1) if (f := self.module_file(".".join(parts[:i])))]

    def split(self, dotted: str) -> tuple[str | None, list[str]]:
        """(longest module prefix that exists as a file, the remaining names)."""
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            if self.module_file(".".join(parts[:i])):
                return ".".join(parts[:i]), parts[i:]
        return None, parts

    def request(self, module: str) -> None:
        if module not in self.wanted:
            self.requested.add(module)

    @property
    def settled(self) -> bool:
        """No module was asked for yet: a None from a lookup means the name really is not there."""
        return not self.requested

    def relative(self, path: str | Path) -> str:
        p = Path(path)
        return str(p.relative_to(self._farm)) if p.is_relative_to(self._farm) else str(p)

    # -- lookups ------------------------------------------------------------------------------------
    def lookup(self, dotted: str) -> griffe.Object | None:
        """The object at `vllm.a.b.Name.member` (aliases followed, inherited members found), or None."""
        module, rest = self.split(dotted)
        if module is None:
            return None
        if module not in self.wanted:
            self.request(module)
            return None
        try:
            obj = self.top.modules_collection.get_member(module)
        except KeyError:
            return None
        for name in rest:
            obj = self.member(obj, name)
            if obj is None:
                return None
        return obj

    def final(self, obj, depth: int = 0):
        while obj is not None and obj.is_alias:
            if depth > 20:
                return None
            obj, depth = self.lookup(obj.target_path), depth + 1
        return obj

    def member(self, obj, name: str, _seen: frozenset = frozenset()):
        obj = self.final(obj)
        if obj is None or obj.path in _seen:
            return None
        if name in obj.members:
            return self.final(obj.members[name])
        if obj.is_module:
            for m in obj.members.values():
                if m.is_alias and getattr(m, "wildcard", None):
                    self.request(m.wildcard)
            return None
        if obj.is_class:
            line = self.instance_attributes(obj).get(name)
            if line is not None:
                attr = griffe.Attribute(name, lineno=line, endlineno=line)
                attr.parent = obj
                attr.labels.add("instance-attribute")
                return attr
            for base in self.bases(obj):
                found = self.member(base, name, _seen | {obj.path})
                if found is not None:
                    return found
        return None

    def bases(self, cls) -> list:
        """In-tree base classes (external ones, e.g. torch's nn.Module, are not followed)."""
        out = []
        for expr in cls.bases:
            path = expr if isinstance(expr, str) else expr.canonical_path
            if path.split(".")[0] == PACKAGE:
                base = self.lookup(path)
                if base is not None and base.is_class:
                    out.append(base)
        return out

    def base_names(self, cls, _seen: frozenset = frozenset()) -> set[str]:
        """Names of every base class, in-tree ones followed (`SupportsEagle3` whichever class adds it)."""
        if cls.path in _seen:
            return set()
        names = {(e if isinstance(e, str) else e.canonical_path).rsplit(".", 1)[-1] for e in cls.bases}
        for base in self.bases(cls):
            names |= self.base_names(base, _seen | {cls.path})
        return names

    def string_lines(self, module: str, needle: str) -> list[int]:
        """Lines of `module` holding a string constant that contains `needle` (implicit concatenation joined)."""
        f = self.module_file(module)
        if f is None:
            return []
        return sorted(
            {
                n.lineno
                for n in ast.walk(parse(str(f)))
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and needle in n.value
            }
        )

    def find_definitions(self, name: str) -> list[str]:
        """Modules that define `name` at top level (def, class or assignment), found by reading every file."""
        return definitions(str(self.root), name)

    # -- source and evidence -------------------------------------------------------------------------
    def where(self, obj, line: int | None = None) -> str:
        node = self.node(obj) if line is None else None
        return f"{self.relative(obj.filepath)}:{line or (node.lineno if node else obj.lineno)}"

    def module_ast(self, obj) -> ast.Module:
        return parse(str(Path(obj.filepath).resolve()))

    def node(self, obj):
        """The def/class AST node of a griffe function or class (griffe's lineno is the first decorator's)."""
        if not (obj.is_function or obj.is_class):
            return None
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if obj.is_function else (ast.ClassDef,)
        for n in ast.walk(self.module_ast(obj)):
            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(n, kinds) and n.name == obj.name and obj.lineno <= n.lineno <= (obj.endlineno or n.lineno):
                return n
        return None

    def instance_attributes(self, cls) -> dict[str, int]:
        """`self.x = ...` targets in the class's methods, tuple targets included (griffe skips those)."""
        node = self.node(cls)
        found: dict[str, int] = {}
        for n in ast.walk(node) if node else ():
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            for t in targets:
                for e in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                    if isinstance(e, ast.Attribute) and getattr(e.value, "id", None) == "self":
                        found.setdefault(e.attr, e.lineno)
        return found

    def returns_class(self, fn):
        """The in-tree class a function is annotated to return (`X`, `X | None`, `Optional[X]`), or None."""
        ret = fn.returns
        if ret is None or isinstance(ret, str):
            return None
        text = str(ret)
        names = [n for n in re.split(r"[\s|\[\],]+", text) if n and n not in ("None", "Optional")]
        if len(names) != 1:
            return None
        path = ret.canonical_path if text == names[0] else _canonical_in(fn, names[0])
        cls = self.lookup(path) if path and path.split(".")[0] == PACKAGE else None
        return cls if cls is not None and cls.is_class else None

    def annotation_class(self, attr):
        """The in-tree class an attribute is annotated with, or None."""
        if attr.annotation is None or isinstance(attr.annotation, str):
            return None
        path = attr.annotation.canonical_path
        cls = self.lookup(path) if path.split(".")[0] == PACKAGE else None
        return cls if cls is not None and cls.is_class else None


def _canonical_in(obj, name: str) -> str | None:
    """What `name` means in `obj`'s module (its import or its own definition)."""
    module = obj.module
    member = module.members.get(name)
    if member is None:
        return None
    return member.target_path if member.is_alias else member.path


def analyse(root: Path, seed: set[str], check: Callable[[Tree], T]) -> T:
    """Run `check` on a tree holding `seed` plus every module the check asks for."""
    wanted = set(seed)
    for _ in range(MAX_ROUNDS):
        tree = Tree(root, wanted)
        try:
            result = check(tree)
            missing = tree.requested - wanted
        finally:
            tree.close()
        if not missing:
            return result
        wanted |= missing
    raise TreeError(f"{root}: the modules the checks need did not settle after {MAX_ROUNDS} rounds")
