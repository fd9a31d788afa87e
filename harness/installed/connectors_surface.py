"""What hs-connectors uses of vLLM, read from its released source (AST), not typed by hand.

speculators 0.8+ takes its hidden-states connectors from the separate `hs-connectors` package, which imports
vLLM internals (the connector base class and its metadata, the example connector it subclasses, config and
parallel-state helpers) and declares no vLLM requirement at all. Its used surface is derived here from its wheel,
as `harness.installed.surface` does for speculators 0.3.0, and stored under `fixtures/surfaces/` for the gate and the
probes: per module, the vLLM names it imports (at any depth), its calls and attribute reads, and each class with
its bases and the methods it defines (a subclass that overrides a private method, like the FP8 connector's
`_write_tensors`, depends on that method's signature).

    python -m harness.installed.connectors_surface [--version 0.9.0]   # rewrites the fixture
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from harness.support.paths import FIXTURES

PROJECT = "hs-connectors"
PACKAGE = "hs_connectors"


def fixture_path(version: str) -> Path:
    return FIXTURES / "surfaces" / f"{PROJECT}-{version}.json"


def _classes(tree: ast.Module) -> dict:
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                "bases": [ast.unparse(b) for b in node.bases],
                "methods": sorted(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
            }
    return out


def parse(version: str) -> dict:
    from harness.envs.wheels import wheel_tree
    from harness.installed import surface

    root = wheel_tree(PROJECT, version) / PACKAGE
    modules = {}
    for path in sorted(root.glob("*.py")):
        name = f"{PACKAGE}.{path.stem}" if path.stem != "__init__" else PACKAGE
        source = path.read_text()
        used = surface.parse(name, source).to_json()
        if not used["imports"]:
            continue  # a module that imports nothing of vLLM has no surface
        used["classes"] = _classes(ast.parse(source))
        modules[name] = used
    return {
        "project": PROJECT,
        "version": version,
        "modules": modules,
        "vllm_imports": sorted({v for m in modules.values() for v in m["imports"].values()}),
    }


def dump(version: str) -> Path:
    path = fixture_path(version)
    path.write_text(json.dumps(parse(version), indent=2, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m harness.installed.connectors_surface",
        description="Rewrite fixtures/surfaces/hs-connectors-<version>.json from that release's wheel.",
    )
    ap.add_argument("--version", default="0.9.0", help="the hs-connectors release to read (default: 0.9.0)")
    print(dump(ap.parse_args().version))
