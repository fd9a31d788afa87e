"""What a speculators release declares it runs with, and its training loader's reader built from that declaration.

A cell "speculators 0.8.0 works on vLLM X" is only worth something if 0.8.0 was run as its users run it: the
hidden-states files read by the hs-connectors release its wheel pins (0.8.0 pins hs-connectors 0.8.0, 0.9.0 pins
0.9.0; 0.5-0.7 read with safetensors directly), and the transformers the run had held against the range the wheel
declares. Both are read from the wheel's own METADATA, never typed by hand.

`reader(version)` returns the function speculators' training loader uses to take a generated file
(hs-connectors' `FileTransfer.get_generated`: its own lock wait, then the safetensors read), loaded from that
hs-connectors wheel under the package's own name; two releases' hs-connectors are never imported at once.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from email.parser import Parser
from pathlib import Path

from harness.envs.wheels import CLIENT_FILE, client_tree, wheel_tree

CONNECTORS = "hs-connectors"


def requirements(version: str) -> dict[str, str]:
    """speculators `version`'s declared runtime requirements, {project: specifier} (markers dropped, extras'
    requirements left out)."""
    from packaging.requirements import Requirement

    tree = client_tree(version)
    meta = next(tree.glob("speculators-*.dist-info/METADATA"))
    out = {}
    for line in Parser().parsestr(meta.read_text()).get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        out[req.name.lower().replace("_", "-")] = str(req.specifier)
    return out


def connectors_pin(version: str) -> str | None:
    """The hs-connectors release speculators `version` pins (`==X`), or None where it declares none."""
    spec = requirements(version).get(CONNECTORS)
    if spec is None:
        return None
    if not spec.startswith("==") or "," in spec:
        raise LookupError(f"speculators {version} declares {CONNECTORS}{spec}: not one release")
    return spec[2:]


def _purge() -> None:
    for name in [m for m in sys.modules if m == "hs_connectors" or m.startswith("hs_connectors.")]:
        del sys.modules[name]


def reader(version: str):
    """(label, read) for speculators `version`: `read(handle, kv_transfer_params)` returns the file's tensors as the
    release's training loader gets them. With a declared hs-connectors: that release's FileTransfer.get_generated,
    called with what its signature takes (0.8: the handle; 0.9: the transfer parameters); else safetensors."""
    pin = connectors_pin(version)
    if pin is None:
        from safetensors.torch import load_file

        return "safetensors load_file (no hs-connectors declared)", lambda handle, params: load_file(
            handle, device="cpu"
        )
    tree = wheel_tree(CONNECTORS, pin)
    _purge()
    sys.path.insert(0, str(tree))
    try:
        module = importlib.import_module("hs_connectors.transfer")
    finally:
        sys.path.remove(str(tree))
    if not str(Path(module.__file__ or "")).startswith(str(tree)):
        raise LookupError(f"hs_connectors was imported from {module.__file__}, not from {CONNECTORS} {pin}'s wheel")
    transfer_cls = module.FileTransfer
    takes = list(inspect.signature(transfer_cls.get_generated).parameters)[1]

    def read(handle: str, params: dict | None):
        transfer = transfer_cls(Path(handle).parent)
        arg = handle if takes == "handle" else (params or {"hidden_states_path": handle})
        return transfer.get_generated(arg)

    return f"{CONNECTORS} {pin} FileTransfer.get_generated({takes})", read


def imports_of(path: Path) -> set[str]:
    """The top-level packages a source file imports (read by AST)."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def transformers_finding(version: str) -> dict:
    """The transformers this process has against speculators `version`'s declared range, and whether the code the
    client path runs (its vllm_client.py and, where pinned, hs-connectors' transfer module) imports transformers."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from packaging.specifiers import SpecifierSet

    spec = requirements(version).get("transformers", "")
    try:
        have = installed("transformers")
    except PackageNotFoundError:
        have = None
    files = [client_tree(version) / CLIENT_FILE]
    pin = connectors_pin(version)
    if pin:
        files.append(wheel_tree(CONNECTORS, pin) / "hs_connectors" / "transfer.py")
    used = any("transformers" in imports_of(f) for f in files)
    return {
        "declared": spec or "any",
        "installed": have,
        "inside": None if have is None else SpecifierSet(spec).contains(have, prereleases=True),
        "imported_by_client_path": used,
    }
