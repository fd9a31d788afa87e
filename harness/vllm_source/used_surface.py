"""speculators' used vLLM surface as the gate reads it: a fixture generated from speculators' source.

The fixture (`fixtures/surfaces/speculators-X.Y.Z.json`) holds what `harness.installed.surface` reads from the
installed speculators (imports, calls with keyword names, attribute reads, collective_rpc method
names) plus *bindings*: which name holds the result of which call (`self.executor = MultiprocExecutor(...)`,
`scheduler_output := self.scheduler.schedule()`). Bindings let the gate follow
`self.executor.collective_rpc(...)` to `MultiprocExecutor.collective_rpc` in each vLLM version.
The gate only reads the fixture, so it runs where speculators is not installed; `generate()`
rewrites it from source (never by hand).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from harness.installed import surface
from harness.support.paths import FIXTURES
from harness.support.report_files import write_atomic

DEFAULT_SPECULATORS = "0.3.0"
DIRECTORY = FIXTURES / "surfaces"


class SurfaceUnavailable(LookupError):
    """No fixture for this speculators version, and it cannot be generated here."""


def fixture_path(speculators: str = DEFAULT_SPECULATORS, directory: Path | None = None) -> Path:
    return (directory or DIRECTORY) / f"speculators-{speculators}.json"


def bindings(source: str) -> dict[str, str]:
    """`target -> callee` for every name or `self.attr` assigned the result of a call (one callee only).

    A target bound to two different callees (two functions reusing a local name) is left out: the
    gate cannot tell which one a later read means.
    """
    seen: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) != 1 or not isinstance(node.value, ast.Call):
                continue
            target, callee = surface._dotted(targets[0]), surface._dotted(node.value.func)
            if target and callee:
                seen.setdefault(target, set()).add(callee)
    return {t: next(iter(c)) for t, c in sorted(seen.items()) if len(c) == 1}


def generate(path: Path | None = None) -> dict:
    """Read the installed speculators' client modules and write the fixture for its version."""
    try:
        installed = version("speculators")
    except PackageNotFoundError:
        raise SurfaceUnavailable("speculators is not installed: cannot regenerate its used surface") from None
    modules = {}
    for module in surface.CLIENT_MODULES:
        source = surface.module_source(module)
        modules[module] = {**surface.parse(module, source).to_json(), "bindings": bindings(source)}
    data = {"speculators": installed, "generated_by": "harness.vllm_source.used_surface.generate", "modules": modules}
    write_atomic(path or fixture_path(installed), json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


@dataclass(frozen=True)
class Call:
    module: str  # the speculators module making the call
    callee: str  # as written: "Scheduler", "self.executor.collective_rpc", "layer"
    keywords: tuple[str, ...]
    n_positional: int
    line: int


@dataclass
class UsedSurface:
    """The fixture, as the checks use it."""

    speculators: str
    path: Path
    imports: dict[str, dict[str, str]] = field(default_factory=dict)  # module -> local name -> "vllm.m:Name"
    bindings: dict[str, dict[str, str]] = field(default_factory=dict)  # module -> target -> callee
    calls: list[Call] = field(default_factory=list)
    attributes: dict[str, list[str]] = field(default_factory=dict)  # module -> dotted reads
    rpc_methods: list[str] = field(default_factory=list)

    def imported_symbols(self) -> list[str]:
        return sorted({s for table in self.imports.values() for s in table.values()})

    def calls_named(self, callee: str) -> list[Call]:
        return [c for c in self.calls if c.callee == callee]


def load(speculators: str = DEFAULT_SPECULATORS, path: Path | None = None) -> UsedSurface:
    path = Path(path or fixture_path(speculators))
    if not path.is_file():
        raise SurfaceUnavailable(
            f"no used-surface fixture {path}; generate it with speculators {speculators} installed "
            f"(`python -m harness gate --regenerate-surface ...`)"
        )
    data = json.loads(path.read_text())
    used = UsedSurface(data["speculators"], path)
    for module, s in sorted(data["modules"].items()):
        used.imports[module] = dict(s["imports"])
        used.bindings[module] = dict(s.get("bindings", {}))
        used.attributes[module] = list(s["attributes"])
        used.rpc_methods += s["rpc_methods"]
        used.calls += [
            Call(module, c["callee"], tuple(c["keywords"]), c["n_positional"], c["line"]) for c in s["calls"]
        ]
    return used
