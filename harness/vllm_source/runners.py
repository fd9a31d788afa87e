"""Which model runner a vLLM worker builds, what that runner holds, and how it orders a step's requests, read
from one version's sources by AST (no griffe, nothing imported).

The harness's worker-side shims read the runner (`worker.model_runner.input_batch.req_ids` gives a step's
requests in the order their rows were captured). vLLM 0.34 deleted the V1 runner that attribute lives on and
builds the V2 runner, which has no persistent `input_batch` and sorts each step's requests by scheduled token
count. Neither change shows in a signature; both are read here for C-chunkedprefill's gate check and for the
harness's own shim surface (`harness.vllm_source.shim_surface`).

A runner is *built by default* when the worker constructs it outside the branches `NOT_DEFAULT` names (the V2
opt-in switch, encoder-only models speculators never extracts from); other branches (the platform: CPUs without
Triton) are the default for some users, so they count. The V2 switch is an opt-in only where VllmConfig leaves it
off unless asked (`v2_by_default`): from vLLM 0.22 `VllmConfig.use_v2_model_runner` returns True wherever Triton
imports and nothing unsupported is configured, i.e. on CUDA hosts, so there both branches count.

An attribute counts as held only where the construction or load path assigns it (`CONSTRUCTION` and the methods
they call through `self`): a `self.model = None` in `shutdown()` says nothing about a running runner.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from harness.vllm_source.source_files import module_file, parse

#: The worker modules whose runner speculators' generator drives (GPU and CPU builds), and their classes.
WORKERS = {"vllm.v1.worker.gpu_worker": "Worker", "vllm.v1.worker.cpu_worker": "CPUWorker"}
#: Text in an `if` test that makes its branch not speculators' default, with why.
NOT_DEFAULT = {
    "use_v2_model_runner": "the opt-in switch to the V2 runner",
    "is_mm_encoder_only": "encoder-only multimodal models, which speculators does not extract from",
}
#: A step's requests sorted by how many tokens each has scheduled: `sorted(<name with one of these>, key=...)`.
ORDER_NAMES = ("num_tokens_per_req", "num_scheduled_tokens")
#: The methods that build a runner and load its model; what they (and the methods they call) assign is held.
CONSTRUCTION = (
    "__init__",
    "load_model",
    "initialize_kv_cache",
    "initialize_kv_cache_tensors",
    "initialize_attn_backend",
    "initialize_metadata_builders",
    "may_reinitialize_input_batch",
)


@dataclass(frozen=True)
class Built:
    """A runner class a worker module constructs."""

    cls: str  # dotted path of the class, as the worker module imports it
    line: int  # where the worker constructs it
    default: bool  # outside the V2 opt-in branch


@dataclass
class Runner:
    """One runner class as a version's sources show it."""

    path: str
    file: str | None  # relative source file, None when the class is not in these sources
    line: int = 1
    attributes: dict[str, str] = field(default_factory=dict)  # self.<name> -> "file:line", bases included
    files: list[str] = field(default_factory=list)  # its module's file, then its vLLM bases' files
    sorts_steps: str | None = None  # "file:line" where a step's requests are sorted by token count

    @property
    def exists(self) -> bool:
        return self.file is not None


def imports_of(module_ast: ast.Module, module: str) -> dict[str, str]:
    """Local name -> dotted target for every `from X import Y [as Z]` anywhere in the module (functions and
    TYPE_CHECKING blocks included; relative imports resolved against `module`)."""
    out: dict[str, str] = {}
    pkg = module.split(".")
    for node in ast.walk(module_ast):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level] + ([base] if base else []))
            for a in node.names:
                out.setdefault(a.asname or a.name, f"{base}.{a.name}")
    return out


@lru_cache(maxsize=32)
def v2_by_default(root: Path) -> bool:
    """Whether VllmConfig turns the V2 runner on without being asked: its `use_v2_model_runner` ends in a plain
    `return True` (the opt-in variable and each feature V2 lacks are checked before it)."""
    f = module_file(Path(root), "vllm.config.vllm")
    if f is None:
        return False
    for node in ast.walk(parse(str(f))):
        if isinstance(node, ast.FunctionDef) and node.name == "use_v2_model_runner":
            return any(
                isinstance(s, ast.Return) and isinstance(s.value, ast.Constant) and s.value.value is True
                for s in node.body
            )
    return False


def built_runners(root: Path, worker_module: str) -> list[Built]:
    """The model-runner classes (`*ModelRunner*`) the worker module constructs, in source order."""
    f = module_file(root, worker_module)
    if f is None:
        return []
    tree = parse(str(f))
    names = imports_of(tree, worker_module)
    found: list[Built] = []
    not_default = {k: v for k, v in NOT_DEFAULT.items() if not (k == "use_v2_model_runner" and v2_by_default(root))}

    def visit(node, opt_in: bool) -> None:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            branch_opt_in = opt_in or any(s in test for s in not_default)
            for child in node.body:
                visit(child, branch_opt_in)
            for child in node.orelse:
                visit(child, opt_in)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and "ModelRunner" in node.func.id:
            target = names.get(node.func.id)
            if target and target.startswith("vllm."):
                found.append(Built(target, node.lineno, not opt_in))
        for sub in ast.iter_child_nodes(node):
            visit(sub, opt_in)

    visit(tree, False)
    return found


def runner(root: Path, path: str, _depth: int = 0) -> Runner:
    """The class at `path` (module.Class): its instance attributes (bases in vLLM followed) and whether it sorts
    a step's requests by token count (in its module)."""
    module, _, name = path.rpartition(".")
    f = module_file(root, module)
    if f is None:
        return Runner(path, None)
    tree = parse(str(f))
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        return Runner(path, None)
    rel = str(f.relative_to(root))
    out = Runner(path, rel, node.lineno, files=[rel])
    if _depth < 6:
        _inherit(root, out, node, imports_of(tree, module), module, _depth)
    methods = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    own = {n.name: f"{rel}:{n.lineno}" for n in methods.values()}  # methods and properties are attributes too
    for e in _self_assignments(_construction(methods)):
        own.setdefault(e.attr, f"{rel}:{e.lineno}")
    out.attributes.update(own)  # the class's own place wins over a base's
    sort = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and _sorts_by_order(n)), None)
    if sort is not None:
        out.sorts_steps = f"{rel}:{sort.lineno}"
    return out


def _inherit(root: Path, out: Runner, node: ast.ClassDef, names: dict, module: str, depth: int) -> None:
    """Attributes, files and a step sort from the class's bases in vLLM (read the same way, recursively)."""
    for base in node.bases:
        dotted = ast.unparse(base)
        target = names.get(dotted.split(".")[0])
        target = (target + dotted[len(dotted.split(".")[0]) :]) if target else f"{module}.{dotted}"
        if target.startswith("vllm."):
            parent = runner(root, target, depth + 1)
            out.attributes.update(parent.attributes)
            out.files += [x for x in parent.files if x not in out.files]
            out.sorts_steps = out.sorts_steps or parent.sorts_steps


def _self_assignments(methods: list):
    """Each `self.<attr>` assigned in `methods` (tuple and list targets unpacked)."""
    for m in methods:
        for n in ast.walk(m):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            for t in targets:
                for e in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                    if isinstance(e, ast.Attribute) and getattr(e.value, "id", None) == "self":
                        yield e


def _sorts_by_order(n: ast.AST) -> bool:
    """A `sorted(...)` call over something named like a step's request order (ORDER_NAMES)."""
    return (
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "sorted"
        and bool(n.args)
        and any(s in ast.unparse(n.args[0]) for s in ORDER_NAMES)
    )


def _construction(methods: dict) -> list:
    """The class's construction and load methods and the methods of the class they call through `self`."""
    todo = [methods[n] for n in CONSTRUCTION if n in methods]
    seen: dict[str, object] = {}
    while todo:
        m = todo.pop()
        if m.name in seen:
            continue
        seen[m.name] = m
        for n in ast.walk(m):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and getattr(n.func.value, "id", None) == "self"
                and n.func.attr in methods
            ):
                todo.append(methods[n.func.attr])
    return list(seen.values())


@dataclass
class WorkerRunners:
    """What one worker module builds, read from one version."""

    worker: str
    file: str | None
    built: list[Built]
    runners: dict[str, Runner]

    @property
    def defaults(self) -> list[Runner]:
        seen = dict.fromkeys(b.cls for b in self.built if b.default)
        return [self.runners[c] for c in seen]

    def where_built(self, cls: str) -> str:
        line = next((b.line for b in self.built if b.cls == cls), 1)
        return f"{self.file}:{line}"


@lru_cache(maxsize=32)
def read(root: str, worker_module: str) -> WorkerRunners:
    r = Path(root)
    f = module_file(r, worker_module)
    built = built_runners(r, worker_module)
    return WorkerRunners(
        worker_module, str(f.relative_to(r)) if f else None, built, {b.cls: runner(r, b.cls) for b in built}
    )


def describe(r: Runner) -> str:
    short = r.path.removeprefix("vllm.")
    if not r.exists:
        return f"{short} (not in these sources)"
    return short
