"""speculators' used vLLM surface, read from the installed speculators source (AST), not typed by hand.

Probes use it to call vLLM with exactly the keywords speculators passes; the pre-upgrade gate uses
it to know which vLLM modules, classes, functions, parameters and attributes to diff.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

GENERATOR_MODULE = "speculators.data_generation.vllm_hidden_states_generator"
WORKER_MODULE = "speculators.data_generation.custom_worker"
CLIENT_MODULES = (GENERATOR_MODULE, WORKER_MODULE)


def module_source(module: str) -> str:
    """The source of an installed module, found without importing it (speculators' import pulls in torch)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{top} is not installed", name=top)
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*rest[:-1], rest[-1] + ".py")
    return path.read_text()


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Call):
        base = _dotted(node.func)
        return f"{base}()" if base else None
    return None


@dataclass
class Call:
    callee: str  # as written: "Scheduler", "self.executor.collective_rpc"
    keywords: list[str]
    n_positional: int
    line: int


@dataclass
class Surface:
    """What one client module uses of vLLM."""

    module: str
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "vllm.module:Name"
    calls: list[Call] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)  # dotted attribute reads, e.g. "model.model"
    rpc_methods: list[str] = field(default_factory=list)  # names passed to collective_rpc

    def keywords_of(self, local_name: str) -> list[str]:
        """Keyword names of the (first) call to `local_name` (e.g. 'Scheduler')."""
        for c in self.calls:
            if c.callee == local_name or c.callee.endswith("." + local_name):
                return list(c.keywords)
        raise LookupError(f"{self.module} never calls {local_name}")

    def to_json(self) -> dict:
        return asdict(self)


def parse(module: str, source: str | None = None) -> Surface:
    tree = ast.parse(source if source is not None else module_source(module))
    s = Surface(module)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
            for alias in node.names:
                s.imports[alias.asname or alias.name] = f"{node.module}:{alias.name}"
        elif isinstance(node, ast.Call):
            callee = _dotted(node.func)
            if callee:
                s.calls.append(Call(callee, [k.arg for k in node.keywords if k.arg], len(node.args), node.lineno))
                first = node.args[0] if node.args else None
                if (
                    callee.endswith("collective_rpc")
                    and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                ):
                    s.rpc_methods.append(first.value)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            dotted = _dotted(node)
            if dotted and not dotted.endswith("()"):
                s.attributes.append(dotted)
    s.attributes = sorted(set(s.attributes))
    return s


@cache
def surface(module: str) -> Surface:
    return parse(module)


def speculators_call(local_name: str, module: str = GENERATOR_MODULE) -> list[str]:
    """The keywords speculators passes to `local_name`, read from its source."""
    return surface(module).keywords_of(local_name)


def dump(path: Path) -> dict:
    """Write the used surface of every client module to `path` (JSON) and return it."""
    from importlib.metadata import version

    data = {"speculators": version("speculators"), "modules": {m: parse(m).to_json() for m in CLIENT_MODULES}}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data
