"""The harness's own vLLM surface: what its shims, worker extension, executor view and transport touch in vLLM,
derived from their code by AST into `fixtures/surfaces/harness-shims.json`, and gated like speculators' surface.

A shim is written against one vLLM: it imports names, calls worker methods over `collective_rpc`, and reads the
model runner the worker builds (`worker.model_runner.input_batch`). When a new vLLM takes one of those away the
shim no longer applies, and a gate that only read speculators' surface would still call the change covered
(vLLM 0.34 deleted the runner C-chunkedprefill's worker shim reads). Each entry is checked against the target's
sources; one that is gone is a finding against the contract whose code uses it, never covered.

Entries (`kind`, `name`, `contract`, `site` = harness file:function):

* `import` - `from vllm.a import B` / `import vllm.a` anywhere in the module (functions included);
* `module` - vLLM modules named as strings in a function that imports them by name, one entry per function
  (`a|b`: any of them will do, the function falls back);
* `rpc` - worker methods called by name through `collective_rpc("name")` (the harness's own `_` names left out);
* `runner` - attributes read on the model runner (`<x>.model_runner.<attr>`), checked on every runner the GPU
  and CPU workers build by default (`harness.vllm_source.runners`).

`python -m harness surface --shims` rewrites the fixture; a unit test holds the committed one to the code.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from harness.support.paths import FIXTURES, SOURCE_ROOT
from harness.vllm_source import runners
from harness.vllm_source.facts import RUNTIME, Fact

FIXTURE = FIXTURES / "surfaces" / "harness-shims.json"
#: The harness code that touches vLLM at run time, relative to the repository root.
SOURCES = (
    "harness/contracts/*.py",
    "harness/runtime/worker.py",
    "harness/runtime/executor_view.py",
    "harness/installed/row_order.py",
    "harness/runtime/transport.py",
)
MODULE_NAME = re.compile(r"^vllm(\.\w+)+$")
KIND = "shim-surface-removed"


def _contract_of(rel: str) -> str:
    path = Path(rel)
    if path.parent.as_posix() == "harness/contracts":
        return path.stem.rstrip("_")  # import_.py holds contract `import`
    return RUNTIME


def _files(root: Path) -> list[Path]:
    out: list[Path] = []
    for pattern in SOURCES:
        out += sorted(p for p in root.glob(pattern) if p.name not in ("__init__.py", "base.py"))
    return out


def _entries(tree: ast.Module, rel: str) -> list[dict]:
    """The module's entries; a site is `file:function` (no line numbers: the fixture stays put while code moves)."""
    contract = _contract_of(rel)
    found: list[dict] = []

    def add(kind: str, name: str, where: str, **extra) -> None:
        found.append({"kind": kind, "name": name, "contract": contract, "site": f"{rel}:{where}", **extra})

    def visit(node, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = node.name if where == "<module>" else f"{where}.{node.name}"
            if not isinstance(node, ast.ClassDef):
                calls = {ast.unparse(n.func).rsplit(".", 1)[-1] for n in ast.walk(node) if isinstance(n, ast.Call)}
                modules = [
                    n.value
                    for n in ast.walk(node)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and MODULE_NAME.match(n.value)
                ]
                if "import_module" in calls and modules:
                    add("module", "|".join(dict.fromkeys(modules)), inner)
            for child in ast.iter_child_nodes(node):
                visit(child, inner)
            return
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm" and not node.level:
            for a in node.names:
                add("import", f"{node.module}:{a.name}", where)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "vllm":
                    add("import", a.name, where)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "collective_rpc":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("_"):
                add("rpc", first.value, where, args=_positional(node))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "model_runner"
        ):
            add("runner", node.attr, where)
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(tree, "<module>")
    return found


def _positional(call: ast.Call) -> int | None:
    """How many positional arguments a `collective_rpc(name, args=(...))` call sends (None: not a literal tuple)."""
    args = next((k.value for k in call.keywords if k.arg == "args"), call.args[2] if len(call.args) > 2 else None)
    if args is None:
        return 0
    if isinstance(args, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in args.elts):
        return len(args.elts)
    return None


def derive(root: Path = SOURCE_ROOT) -> dict:
    """The surface as the code shows it now (sorted, one entry per kind, name and site; an RPC sent with several
    argument counts at one site keeps the largest, which is what the worker's method must accept)."""
    entries: list[dict] = []
    for f in _files(root):
        rel = f.relative_to(root).as_posix()
        entries += _entries(ast.parse(f.read_text()), rel)
    unique: dict = {}
    for e in entries:
        key = (e["kind"], e["name"], e["site"])
        if key in unique and "args" in e:
            sent = [n for n in (unique[key].get("args"), e["args"]) if n is not None]
            e = {**e, "args": max(sent) if len(sent) == 2 else None}
        unique[key] = e
    return {
        "generated_by": "harness.vllm_source.shim_surface.derive",
        "sources": list(SOURCES),
        "entries": [unique[k] for k in sorted(unique)],
    }


def write(path: Path = FIXTURE) -> Path:
    from harness.support.report_files import write_atomic

    write_atomic(path, json.dumps(derive(), indent=1, sort_keys=True) + "\n")
    return path


def load(path: Path = FIXTURE) -> list[dict]:
    return json.loads(path.read_text())["entries"]


# -- the gate's reading of one version ----------------------------------------------------------------------
def _required_positional(root: Path, where: str) -> int | None:
    """The positional parameters without a default of the method defined at `where` ("file:line"), self left out."""
    from harness.vllm_source.source_files import parse

    rel, _, line = where.rpartition(":")
    node = next(
        (
            n
            for n in ast.walk(parse(str(root / rel)))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno == int(line)
        ),
        None,
    )
    if node is None:
        return None
    positional = [*node.args.posonlyargs, *node.args.args][1:]
    return len(positional) - len(node.args.defaults)


def engine_calls(tree) -> set[str]:
    """The executor methods EngineCore's KV-cache set-up calls in this version (empty where it is not read)."""
    from harness.vllm_source import engine_setup

    steps, _ = engine_setup.steps(tree.root)
    return {s.name for s in steps if s.on_executor}


def facts(tree, entries: list[dict]) -> list[Fact]:
    """One fact per entry: still there in this version's sources (holds), gone (a finding), or not readable."""
    root = Path(tree.root)
    workers = {w: runners.read(str(root), w) for w in runners.WORKERS}
    worker_classes = [runners.runner(root, f"{w}.{cls}") for w, cls in runners.WORKERS.items()]
    out = []
    for e in entries:
        kind, name, site = e["kind"], e["name"], e["site"]
        symbol = {"rpc": f"worker.{name}()", "runner": f"worker.model_runner.{name}"}.get(kind, name)
        entry = Entry(
            e["contract"],
            kind,
            name,
            site,
            symbol,
            e.get("args"),
            f"shim no longer applies: {site} uses {symbol}, which these sources no longer have",
        )
        if kind == "import":
            out.append(_import_fact(tree, root, entry))
        elif kind == "module":
            out.append(_module_fact(tree, root, entry))
        elif kind == "rpc":
            out.append(_rpc_fact(tree, root, entry, worker_classes))
        elif kind == "runner":
            out.append(_runner_fact(entry, [r for w in workers.values() for r in w.defaults]))
    return out


@dataclass(frozen=True)
class Entry:
    """One name a shim uses, as `facts` reads it: whose, what kind, where the shim uses it, how a report names it,
    the arguments it sends (an RPC), and the finding's reason where it is gone."""

    contract: str
    kind: str
    name: str
    site: str
    symbol: str
    args: int | None
    why: str

    def fact(self, kind: str, value: str, holds: bool, evidence: str) -> Fact:
        """A fact that is a `changed-unclassified`-kind finding where it does not hold, with the reason."""
        detail = {"why": self.why}
        return Fact(
            self.contract, self.symbol, kind, value, holds, KIND, evidence=evidence, site=self.site, detail=detail
        )


def _import_fact(tree, root: Path, e: Entry) -> Fact:
    """`module` or `module:attr` the shim imports: importable, pending (the tree is not fully read), or gone."""
    module, _, attr = e.name.partition(":")
    where = tree.module_file(module)
    obj = tree.lookup(f"{module}.{attr}") if (where and attr) else None
    if where is not None and (not attr or obj is not None):
        evidence = tree.where(obj) if obj is not None else f"{where.relative_to(root)}:1"
        return Fact(e.contract, e.symbol, "shim-import", "importable", True, evidence=evidence, site=e.site)
    if where is not None and attr and not tree.settled:
        return Fact(e.contract, e.symbol, "shim-import", "pending", None, site=e.site)
    gone = "module gone" if where is None else f"{attr} not in {module}"
    evidence = f"{module.replace('.', '/')}.py" + ("" if where else " (no such module)")
    return e.fact("shim-import", gone, False, evidence)


def _module_fact(tree, root: Path, e: Entry) -> Fact:
    """`a|b|c`: one of the modules the shim can use is present."""
    options = e.name.split("|")
    present = [m for m in options if tree.module_file(m) is not None]
    evidence = (
        f"{tree.module_file(present[0]).relative_to(root)}:1"
        if present
        else f"{options[0].replace('.', '/')}.py (no such module)"
    )
    return e.fact("shim-module", f"{present[0]} present" if present else "all gone", bool(present), evidence)


def _rpc_fact(tree, root: Path, e: Entry, worker_classes: list) -> Fact:
    """A worker method the shim calls by RPC: defined on every worker class (and taking the arguments the shim
    sends), absent where EngineCore never calls it (the feature is not in this vLLM), or absent (a finding)."""
    having = [c for c in worker_classes if c.exists and e.name in c.attributes]
    absent = [c for c in worker_classes if c.exists and e.name not in c.attributes]
    if not any(c.exists for c in worker_classes):
        return Fact(e.contract, e.symbol, "shim-rpc", "no worker class in these sources", None, site=e.site)
    if not having and e.name not in engine_calls(tree):
        return Fact(
            e.contract,
            e.symbol,
            "shim-rpc",
            "absent, and EngineCore's set-up never calls it: the "
            "feature the shim serves is not in this vLLM (the shim is selected only where it is)",
            True,
            evidence=f"{absent[0].file}:{absent[0].line}",
            site=e.site,
        )
    required = _required_positional(root, having[0].attributes[e.name]) if having else None
    if not absent and required is not None and e.args is not None and required > e.args:
        return Fact(
            e.contract,
            e.symbol,
            "shim-rpc",
            f"takes {required} positional argument(s), the shim sends {e.args}",
            False,
            KIND,
            evidence=having[0].attributes[e.name],
            site=e.site,
            detail={
                "why": f"shim no longer applies: {e.site} calls {e.symbol} with {e.args} argument(s) "
                f"and this version's method requires {required}"
            },
        )
    status = "defined" if not absent else f"absent from {', '.join(runners.describe(c) for c in absent)}"
    evidence = having[0].attributes[e.name] if having else f"{absent[0].file}:{absent[0].line}"
    return e.fact("shim-rpc", status, not absent, evidence)


def _runner_fact(e: Entry, built: list) -> Fact:
    """An attribute the shim reads on the model runner: on every runner the workers build by default."""
    if not built:
        return Fact(e.contract, e.symbol, "shim-runner", "no runner built by a worker was read", None, site=e.site)
    absent = [r for r in built if e.name not in r.attributes]
    status = (
        "on every runner the workers build"
        if not absent
        else f"absent from {', '.join(runners.describe(r) for r in absent)}"
    )
    evidence = f"{absent[0].file}:{absent[0].line}" if absent else built[0].attributes[e.name]
    return e.fact("shim-runner", status, not absent, evidence)
