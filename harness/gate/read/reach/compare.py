"""Comparing a release's reachable functions with the baseline's: unchanged, compatible (only optional parameters
added), or a `changed-unclassified` finding with its file:line and diff, unless a targeted check already
classified a finding inside it."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from harness.gate.read.reach.follow import platform_roles, reachable
from harness.gate.read.reach.index import Fn, Index
from harness.gate.read.reach.neutral import module_names, neutral
from harness.gate.read.reach.scope import WATCH


@dataclass
class Change:
    contract: str
    platform: str
    key: str
    kind: str  # "changed" | "new" | "compatible" | "neutral" (harness.gate.read.reach.neutral: `why`)
    evidence: str  # file:line in the candidate
    via: str  # how the watched path reaches it
    diff: str = ""
    contracts: list = field(default_factory=list)  # every contract whose path reaches it
    classified_by: str | None = None  # a targeted check's finding inside this function
    why: str = ""  # a neutral change: which of the rule's edits it is

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
                kind, why = _kind(o, fn, loggers(old_root, o), loggers(new_root, fn))
                diff = function_diff(o, fn)
                out[key] = Change(
                    contract, platform.name, key, kind, f"{fn.file}:{fn.line}", via, diff, [contract], why=why
                )
    return list(out.values())


def _kind(o: Fn | None, fn: Fn, old_loggers: frozenset, new_loggers: frozenset) -> tuple[str, str]:
    if o is None:
        return "new", ""
    if o.body == fn.body and compatible_signature(o.signature, fn.signature):
        return "compatible", ""
    why = neutral(o.node, fn.node, old_loggers, new_loggers)
    return ("neutral", why) if why else ("changed", "")


def loggers(root: Path, fn: Fn | None) -> frozenset:
    """The top-level names of the module `fn` lives in (a log line's logger must be one)."""
    return frozenset() if fn is None else _module_names(str(Path(root) / fn.file))


@lru_cache(maxsize=1024)
def _module_names(path: str) -> frozenset:
    import ast

    try:
        return module_names(ast.parse(Path(path).read_text(encoding="utf-8-sig")))
    except (OSError, SyntaxError):
        return frozenset()


def function_diff(old: Fn | None, new: Fn) -> str:
    """The whole change a reviewer reads, none of it cut: a changed function's unified diff (every hunk; line numbers
    count from its `def`, in the function as the syntax tree prints it, docstrings left out: the entry's evidence is
    the file and line of that `def`); a new function's code, every line added."""
    if old is None:
        return "\n".join("+" + line for line in new.text.splitlines())
    lines = difflib.unified_diff(
        old.text.splitlines(), new.text.splitlines(), "baseline", "candidate", lineterm="", n=1
    )
    return "\n".join(list(lines)[2:])


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
