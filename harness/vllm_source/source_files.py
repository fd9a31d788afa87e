"""Reading a vLLM version's source files without importing them: a file parsed once per content, a module's file,
the modules that define a name. What was read is recorded in `READ`, so the mutation suite knows which files
decided a version's facts."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

PACKAGE = "vllm"


def module_file(root: Path, module: str) -> Path | None:
    """The file of `module` (a package's __init__.py, else module.py) under the sources' `root`, or None."""
    base = Path(root).joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def module_of(rel: str) -> str:
    """The module a source file relative to the root holds (`vllm/a/b.py` -> `vllm.a.b`)."""
    parts = Path(rel).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: What the reading of a version looked at, for a caller that wants to know which files decided its facts (the
#: mutation suite: a mutant that changes none of them has the baseline's facts). Files parsed or linked for
#: griffe, and names searched for across the whole tree.
READ: dict[str, set] = {"files": set(), "names": set()}


def parse(path: str) -> ast.Module:
    data = Path(path).read_bytes()
    READ["files"].add(str(Path(path).resolve()))
    return _parse_text(data)


@lru_cache(maxsize=512)
def _parse_text(data: bytes) -> ast.Module:
    """Parsed once per content: copies of a tree (the mutation suite's) share every unchanged file's parse."""
    return ast.parse(data.decode("utf-8-sig"))


def definitions(root: str, name: str) -> list[str]:
    READ["names"].add(name)
    return _definitions_in(root, name)


@lru_cache(maxsize=64)
def _definitions_in(root: str, name: str) -> list[str]:
    pattern = re.compile(
        rf"^(?:(?:async\s+)?def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*(?::[^=\n]*)?=", re.MULTILINE
    )
    base = Path(root)
    found = []
    for f in sorted(base.joinpath(PACKAGE).rglob("*.py")):
        if pattern.search(f.read_text(encoding="utf-8", errors="replace")):
            rel = f.relative_to(base).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found.append(".".join(parts))
    return found
