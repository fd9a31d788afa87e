"""What speculators' server path needs of a vLLM source tree, read by AST: the server's export (the speculative
method `extract_hidden_states`, the hidden-states connector registered with the factory, the connector module path
hs-connectors loads through), every vLLM name hs-connectors imports, and its subclasses' overrides and abstract
methods against their vLLM bases; and which class serves `extract_hidden_states` on the runner a GPU worker builds.
The client gate (harness.gate.client) judges these needs on both sides of a move; the client contracts
(harness.clients.contracts) read the installed vLLM with them."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path

from harness.installed.connectors_surface import fixture_path as connectors_fixture
from harness.subjects.releases import CONNECTORS_OF

#: The classes that serve the `extract_hidden_states` method, by the runner package they belong to.
SERVER_CLASS = re.compile(r"^class (ExtractHiddenStates(?:Speculator|Proposer))\b", re.MULTILINE)


# --- reading a vLLM source tree -----------------------------------------------------------------------------


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _rel(root: Path, path: Path, line: int | None = None) -> str:
    return f"{path.relative_to(root).as_posix()}" + (f":{line}" if line else "")


def _defines(tree: ast.Module, name: str) -> int | None:
    """The line where a module binds `name` at top level (def, class, assignment, import), or None."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node.lineno
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node.lineno
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return node.lineno
        if isinstance(node, ast.If):  # TYPE_CHECKING / version branches
            inner = _defines(ast.Module(body=node.body + node.orelse, type_ignores=[]), name)
            if inner:
                return inner
    return None


class Tree:
    """One vLLM source tree, its modules parsed on demand."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._parsed: dict[str, tuple[Path, ast.Module] | None] = {}

    def module(self, name: str):
        if name not in self._parsed:
            path = _module_file(self.root, name)
            self._parsed[name] = (path, ast.parse(path.read_text())) if path else None
        return self._parsed[name]

    def has_name(self, module: str, name: str) -> tuple[bool, str]:
        got = self.module(module)
        if got is None:
            return False, f"no module {module}"
        path, tree = got
        line = _defines(tree, name)
        if line:
            return True, _rel(self.root, path, line)
        sub = _module_file(self.root, f"{module}.{name}")
        if sub:  # `from pkg import submodule`
            return True, _rel(self.root, sub)
        return False, f"{module} ({_rel(self.root, path)}) does not define {name}"

    def klass(self, module: str, name: str):
        got = self.module(module)
        if got is None:
            return None, None
        path, tree = got
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
        return path, cls

    def text_has(self, module: str, pattern: str) -> tuple[bool, str]:
        got = self.module(module)
        if got is None:
            return False, f"no module {module}"
        path, _ = got
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                return True, _rel(self.root, path, i)
        return False, f"{_rel(self.root, path)} has no {pattern!r}"


# --- what the client's path needs --------------------------------------------------------------------------

#: A check on a tree (and, for some, the other side's tree and whether this side is the candidate): holds, evidence.
Check = Callable[..., tuple[bool, str]]
#: (id, what it needs, check)
Need = tuple[str, str, Check]


def _server_needs() -> list[Need]:
    return [
        (
            "serve-method",
            "SpeculativeConfig accepts method 'extract_hidden_states'",
            lambda t: t.text_has("vllm.config.speculative", r"[\"']extract_hidden_states[\"']"),
        ),
        (
            "serve-connector",
            "the connector factory registers ExampleHiddenStatesConnector",
            lambda t: t.text_has(
                "vllm.distributed.kv_transfer.kv_connector.factory", r"[\"']ExampleHiddenStatesConnector[\"']"
            ),
        ),
        (
            "serve-module-path",
            "KVTransferConfig has kv_connector_module_path (how hs-connectors' connectors load)",
            lambda t: t.text_has("vllm.config.kv_transfer", r"^\s+kv_connector_module_path\s*:"),
        ),
    ]


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]


def _is_abstract(fn) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "abstractmethod")
        or (isinstance(d, ast.Attribute) and d.attr == "abstractmethod")
        for d in fn.decorator_list
    )


def connector_needs(surface: dict) -> list[Need]:
    needs: list[Need] = []
    for ref in surface["vllm_imports"]:
        module, name = ref.split(":")
        needs.append(
            (
                f"import {ref}",
                f"hs-connectors imports {name} from {module}",
                lambda t, m=module, n=name: t.has_name(m, n),
            )
        )
    for mod_name, mod in surface["modules"].items():
        imports = mod["imports"]
        for cls_name, cls in mod.get("classes", {}).items():
            for base in cls["bases"]:
                head, _, attr = base.partition(".")
                ref = imports.get(head)
                if ref is None:
                    continue
                module, name = ref.split(":")
                if attr:  # `_mod.Class` where `_mod` is an imported vLLM module
                    module, name = f"{module}.{name}", attr
                ours = set(cls["methods"])
                needs.append(
                    (
                        f"subclass {cls_name}({name})",
                        f"{mod_name}.{cls_name}: its private overrides exist in {name} with the same "
                        f"parameters, and it implements {name}'s abstract methods",
                        lambda t, other=None, cand=True, m=module, n=name, o=ours: _subclass_holds(
                            t, m, n, o, other, cand
                        ),
                    )
                )
    return needs


def _methods(tree: Tree | None, module: str, name: str):
    if tree is None:
        return None, None
    path, cls = tree.klass(module, name)
    if cls is None:
        return None, None
    return path, cls, {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _subclass_holds(
    tree: Tree, module: str, name: str, ours: set[str], other: Tree | None = None, candidate: bool = True
) -> tuple[bool, str]:
    """`tree`'s base class against the subclass: a private method of the subclass is an override where the base
    defines it on either side read (`other`: the gate's other tree); on the candidate side the base must define it
    with the parameters it has on the other side. The base's abstract methods must all be implemented."""
    got = _methods(tree, module, name)
    if got[0] is None:
        return False, f"no class {name} in {module}"
    path, cls, theirs = got
    other_methods = (_methods(other, module, name) + (None,))[2] or {}
    private = sorted(m for m in ours if m.startswith("_") and not m.startswith("__"))
    overrides = [m for m in private if m in theirs or m in other_methods]
    where = _rel(tree.root, path, cls.lineno)
    broken = _broken_override(name, where, overrides, theirs, other_methods if candidate else {}, ours)
    if broken:
        return False, broken
    sigs = [f"overrides {m}({', '.join(_params(theirs[m]))})" for m in overrides]
    return True, where + (f"; {'; '.join(sigs)}" if sigs else "")


def _broken_override(name: str, where: str, overrides: list, theirs: dict, other: dict, ours: set) -> str | None:
    """Why the base no longer fits the subclass: an overridden method gone, its parameters changed against the
    other side (`other`: empty where that is not asked), or an abstract method the subclass does not implement."""
    gone = [m for m in overrides if m not in theirs]
    if gone:
        return f"{name} ({where}) defines no {', '.join(gone)}, which the subclass overrides"
    changed = [m for m in overrides if m in other and _params(other[m]) != _params(theirs[m])]
    if changed:
        return (
            f"{name}.{changed[0]} ({where}) takes ({', '.join(_params(theirs[changed[0]]))}) here, "
            f"({', '.join(_params(other[changed[0]]))}) on the other side"
        )
    abstract = sorted(m for m, fn in theirs.items() if _is_abstract(fn) and m not in ours)
    if abstract:
        return f"{name} ({where}) has abstract {', '.join(abstract)}, which the subclass does not implement"
    return None


def needs_of(version: str) -> list[Need]:
    connectors = CONNECTORS_OF[version]
    if connectors is None:  # vLLM's own connector writes the files: hs-connectors' loading path is not needed
        return [n for n in _server_needs() if n[0] != "serve-module-path"]
    surface = json.loads(connectors_fixture(connectors).read_text())
    return _server_needs() + connector_needs(surface)


def server_implementation(root: Path) -> str | None:
    """`file:Class` of what serves `extract_hidden_states` on the runner the GPU worker builds by default: the class
    in that runner's package's `spec_decode`, else in vLLM's V1 `vllm/v1/spec_decode`; None where neither has it."""
    from harness.vllm_source import runners

    root = Path(root)
    packages = [r.path.rsplit(".", 2)[0] for r in runners.read(str(root), "vllm.v1.worker.gpu_worker").defaults]
    for folder in [*(root.joinpath(*p.split("."), "spec_decode") for p in packages), root / "vllm/v1/spec_decode"]:
        for f in sorted(folder.glob("*.py")) if folder.is_dir() else ():
            m = SERVER_CLASS.search(f.read_text(encoding="utf-8", errors="replace"))
            if m:
                return f"{f.relative_to(root).as_posix()}:{m.group(1)}"
    return None
