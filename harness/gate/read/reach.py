"""Reachability: the vLLM code each contract watches, followed through calls, and what changed on it.

Patterns catch the shapes they were written for; a nightly moves the same step behind a helper, sends it by
`collective_rpc("name")`, assigns an attribute in another method or moves a sort into the scheduler. So the gate
also reads paths: each watched path starts at named entry points (EngineCore's set-up, the worker's and runner's
construction, load and execute path, the scheduler's request path) and follows, per platform, what a call reaches:

* `self.m()`: the method `m` of the concrete class being followed (its MRO), so a subclass's override counts;
* `super().m()`: the next definition of `m` after the class the call is written in;
* `self.<attr>.m()`: the class of the attribute, from `self.<attr> = Cls(...)` or `self.<attr>: Cls` in the class
  and its bases, else its role (`ROLES`: the executor, the worker, the model runner, the scheduler);
* `collective_rpc("name")` (on anything, the method as first argument or `method=`): the worker's method `name`;
* `f()` and `Cls()`: a function or class of the watched packages, through the module's imports.

The concrete classes are the platform's (`PLATFORMS`): the CUDA worker and the CPU worker, each with the runners it
builds by default (`harness.vllm_source.runners`), since CPU and CUDA builds run different code. Calls under a condition on
a feature speculators' configuration never turns on (`NEVER_ENABLED`) are not followed: that code never runs for it.

A reachable function is compared with the baseline's function of the same name by its syntax tree with docstrings
(and so comments and formatting) left out. Unchanged is read and fine; a signature that only gained optional
parameters, body unchanged, is compatible; any other difference, or a function the baseline does not have, is a
`changed-unclassified` finding with file:line and the diff, unless one of the targeted checks already reported a
finding inside that function (then that check classified it). Such a finding never lets the gate say SAFE.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from harness.vllm_source.tree import module_of

#: The packages whose code the watched paths may enter (calls out of them are leaves).
PACKAGES = ("vllm/v1/engine", "vllm/v1/worker", "vllm/v1/core", "vllm/v1/executor", "vllm/v1/request.py")
#: Text in an `if` test for a feature speculators' generator never enables (it builds its own VllmConfig):
#: the branch taken with it on is not followed.
NEVER_ENABLED = (
    "kv_transfer_config",
    "ec_transfer_config",
    "lora_config",
    "speculative_config",
    "is_pooling_model",
    "kv_connector",
    "VLLM_ELASTIC_EP",
    "is_elastic_ep",
    "dcp_world_size",
    "pcp_world_size",
    "use_ubatching",
    "supports_mm_inputs",
    "is_multimodal",
    "structured_output",
    "pooling",
    "enable_return_routed_experts",
    "is_encoder_decoder",
    "has_encoder",
    "sleep_mode",
    "is_sleeping",
)
#: Attribute names whose class is a role, resolved per platform.
ROLES = {
    "model_executor": "executor",
    "executor": "executor",
    "model_runner": "runner",
    "worker": "worker",
    "driver_worker": "worker",
    "scheduler": "scheduler",
}
ENGINE = "vllm.v1.engine.core.EngineCore"
SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
EXECUTORS = (
    "vllm.v1.executor.multiproc_executor.MultiprocExecutor",
    "vllm.v1.executor.uniproc_executor.UniProcExecutor",
)
#: Platform -> its worker module and class (the runners come from what that worker builds by default).
PLATFORMS = {"cuda": ("vllm.v1.worker.gpu_worker", "Worker"), "cpu": ("vllm.v1.worker.cpu_worker", "CPUWorker")}
#: Contract -> its entry points, (role, method), and the roles whose code its path enters. A call into another
#: role's method is a step of the path (a leaf: listed, not compared): the set-up path names the worker methods
#: EngineCore has the executor run (speculators replays or skips them: C-kvlayout's check), while their insides
#: are the worker paths'. Module functions are followed in the modules of the entered roles' classes (helpers
#: written for them); a library module's function (vllm.v1.core.kv_cache_planning, which speculators calls itself
#: and whose imports and signatures C-kvhelpers checks) is a leaf.
WATCH: dict[str, tuple[tuple[tuple[str, str], ...], frozenset[str]]] = {
    "kvlayout": ((("engine", "__init__"), ("engine", "_initialize_kv_caches")), frozenset({"engine", "executor"})),
    "runtime": (
        (
            ("worker", "__init__"),
            ("worker", "init_device"),
            ("worker", "load_model"),
            ("worker", "initialize_from_config"),
            ("worker", "compile_or_warm_up_model"),
            ("runner", "__init__"),
            ("runner", "load_model"),
            ("runner", "initialize_kv_cache"),
        ),
        frozenset({"worker", "runner"}),
    ),
    "twophase": ((("worker", "execute_model"), ("worker", "sample_tokens")), frozenset({"worker", "runner"})),
    "chunkedprefill": (
        (
            ("scheduler", "schedule"),
            ("runner", "_update_states"),
            ("runner", "prepare_inputs"),
            ("runner", "_prepare_inputs"),
        ),
        frozenset({"scheduler", "runner", "batch"}),
    ),
}
KIND = "changed-unclassified"


# -- one version's functions -------------------------------------------------------------------------------
@dataclass
class Fn:
    key: str  # module:Class.name or module:name
    file: str
    line: int
    end: int
    text: str  # the source without docstrings, as the AST prints it
    signature: tuple  # (name, has default) per parameter, *args and **kwargs marked
    body: str  # digest of the body without docstrings
    node: ast.AST = field(repr=False, compare=False, default=None)


@dataclass
class ClassInfo:
    dotted: str
    bases: list[str]
    methods: dict[str, Fn]
    attr_types: dict[str, str]  # self.<attr> -> dotted class (assigned Cls(...) or annotated)


def _strip_docstrings(node: ast.AST) -> ast.AST:
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            n.body = body[1:] or [ast.Pass()]
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

    clean = _strip_docstrings(copy.deepcopy(node))
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
    return Module(name, imports, classes, functions)


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


# -- following calls ---------------------------------------------------------------------------------------
@dataclass
class Platform:
    name: str
    roles: dict[str, list[str]]  # role -> concrete classes

    def role_of(self, index: Index, cls: str | None) -> str | None:
        """The role a class plays here: one of the role classes or a base of one."""
        if cls is None:
            return None
        for role, classes in self.roles.items():
            for c in classes:
                if cls == c or any(x.dotted == cls for x in index.mro(c)):
                    return role
        return None


def platform_roles(root: Path, index: Index) -> list[Platform]:
    from harness.vllm_source import runners

    out = []
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
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in fn_node.body:
        visit(stmt)
    return found


def _rpc_name(call: ast.Call) -> str | None:
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "collective_rpc"):
        return None
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "method"), None)
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def reachable(index: Index, platform: Platform, entries, enter: frozenset[str]) -> dict[str, tuple[Fn, str, bool]]:
    """Function key -> (function, how it was reached, followed) for what the entry points reach on `platform`;
    followed False: a step into a role the path does not enter (listed, not compared)."""
    seen: dict[str, tuple[Fn, str, bool]] = {}
    todo: list[tuple[Fn, str | None, str]] = []  # (function, concrete class of self, via)
    for role, name in entries:
        for concrete in platform.roles.get(role, []):
            fn = index.method(concrete, name)
            if fn is not None:
                todo.append((fn, concrete, f"{role} {concrete.rsplit('.', 1)[1]}.{name}"))
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
    return seen


def _targets(index: Index, platform: Platform, fn: Fn, module: str, concrete: str | None, defining: str | None):
    for call in _calls(fn.node):
        f = call.func
        name = _rpc_name(call)
        if name is not None:
            for worker in platform.roles["worker"]:
                t = index.method(worker, name)
                if t is not None:
                    yield t, worker
        if isinstance(f, ast.Attribute):
            v = f.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls") and concrete:
                t = index.method(concrete, f.attr)
                if t is not None:
                    yield t, concrete
            elif (
                isinstance(v, ast.Call)
                and isinstance(v.func, ast.Name)
                and v.func.id == "super"
                and concrete
                and defining
            ):
                t = index.method(concrete, f.attr, after=defining)
                if t is not None:
                    yield t, concrete
            elif isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self" and concrete:
                typed = index.attr_type(concrete, v.attr)
                classes = [typed] if typed and index.cls(typed) is not None else []
                classes += platform.roles.get(ROLES.get(v.attr, ""), [])
                for c in dict.fromkeys(classes):
                    t = index.method(c, f.attr)
                    if t is not None:
                        yield t, c
            elif isinstance(v, ast.Name):  # executor.x() on a local named like a role, module.func()
                for c in platform.roles.get(ROLES.get(v.id, ""), []):
                    t = index.method(c, f.attr)
                    if t is not None:
                        yield t, c
        elif isinstance(f, ast.Name):
            cls = index.resolve_class(module, f.id)
            if cls is not None:
                for init in ("__init__", "__post_init__"):
                    t = index.method(cls, init)
                    if t is not None:
                        yield t, cls
                continue
            t = index.function(module, f.id)
            if t is not None:
                yield t, None


# -- comparing two versions --------------------------------------------------------------------------------
@dataclass
class Change:
    contract: str
    platform: str
    key: str
    kind: str  # "changed" | "new" | "compatible"
    evidence: str  # file:line in the candidate
    via: str  # how the watched path reaches it
    diff: str = ""
    contracts: list = field(default_factory=list)  # every contract whose path reaches it
    classified_by: str | None = None  # a targeted check's finding inside this function

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def compatible_signature(old: tuple, new: tuple) -> bool:
    """Only optional parameters added: every old parameter still there, of the same kind, in the same order, the
    positional ones at the same place, none that had a default lost it, and every new one optional."""
    old_map = {n: (d, k) for n, d, k in old}
    new_map = {n: (d, k) for n, d, k in new}
    if any(n not in new_map or new_map[n][1] != k or (d and not new_map[n][0]) for n, (d, k) in old_map.items()):
        return False
    if [n for n, _, _ in new if n in old_map] != [n for n, _, _ in old]:
        return False
    old_pos = [n for n, _, k in old if k == "p"]
    if [n for n, _, k in new if k == "p"][: len(old_pos)] != old_pos:
        return False
    return all(d or k in ("*", "**") for n, d, k in new if n not in old_map)


def changes(old: Index, new: Index, old_root: Path, new_root: Path) -> list[Change]:
    """Every function a watched path follows in the candidate that is new or differs from the baseline's, once
    (under the first contract whose path reaches it; `contracts` names them all)."""
    before = old.all_functions()
    by_name: dict[str, list[Fn]] = {}
    for f in before.values():
        by_name.setdefault(f.key.split(":", 1)[1], []).append(f)
    out: dict[str, Change] = {}
    for platform in platform_roles(new_root, new):
        for contract, (entries, enter) in WATCH.items():
            for key, (fn, via, followed) in sorted(reachable(new, platform, entries, enter).items()):
                if not followed:
                    continue
                if key in out:
                    if contract not in out[key].contracts:
                        out[key].contracts.append(contract)
                    continue
                o = before.get(key)
                if o is None:  # moved to another module: the baseline's function of the same name, if only one
                    same = by_name.get(key.split(":", 1)[1], [])
                    o = same[0] if len(same) == 1 else None
                if o is not None and o.text == fn.text:
                    continue
                if o is None:
                    kind = "new"
                elif o.body == fn.body and compatible_signature(o.signature, fn.signature):
                    kind = "compatible"
                else:
                    kind = "changed"
                diff = (
                    ""
                    if o is None
                    else "\n".join(
                        list(
                            difflib.unified_diff(
                                o.text.splitlines(), fn.text.splitlines(), "baseline", "candidate", lineterm="", n=1
                            )
                        )[2:40]
                    )
                )
                out[key] = Change(contract, platform.name, key, kind, f"{fn.file}:{fn.line}", via, diff, [contract])
    return list(out.values())


def watched(index: Index, root: Path) -> dict[str, dict[str, int]]:
    """Contract -> platform -> how many functions its path follows (for the report)."""
    out: dict[str, dict[str, int]] = {}
    for platform in platform_roles(root, index):
        for contract, (entries, enter) in WATCH.items():
            reached = reachable(index, platform, entries, enter)
            out.setdefault(contract, {})[platform.name] = sum(f for _, _, f in reached.values())
    return out


def spans(index: Index) -> dict[str, list[tuple[int, int, str]]]:
    """File -> (first line, last line, key) of every function, to tell which function a finding's evidence is in."""
    out: dict[str, list[tuple[int, int, str]]] = {}
    for fn in index.all_functions().values():
        out.setdefault(fn.file, []).append((fn.line, fn.end, fn.key))
    return out


def review(old_root: Path, new_root: Path, findings) -> tuple[list[Change], dict]:
    """The watched paths' changes between two trees, each marked with the targeted finding that classifies it
    (one whose evidence lies inside the changed function), and how many functions each path reaches."""
    old, new = Index(old_root), Index(new_root)
    found = changes(old, new, Path(old_root), Path(new_root))
    where = spans(new)
    for c in found:
        for f in findings:
            file, _, line = (f.evidence or "").rpartition(":")
            if not line.isdigit():
                continue
            if any(a <= int(line) <= b and k == c.key for a, b, k in where.get(file, ())):
                c.classified_by = f"{f.contract}/{f.kind}: {f.symbol}"
                break
    return found, watched(new, Path(new_root))
