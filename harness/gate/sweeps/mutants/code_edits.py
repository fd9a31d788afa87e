"""The neutral operators that change code, not text around it: edits the gate's neutral-edit rule
(harness.gate.read.reach.neutral) must classify, so that the mutation report counts any it flags as a false alarm."""

from __future__ import annotations

import ast
from typing import Any

from harness.gate.sweeps.mutants.edits import insert_at_top, replace_node
from harness.gate.sweeps.mutants.operators import Candidates, Site


def _renamed_local(t: str, fn):
    """A builder: `fn` with its first local name renamed everywhere in it, or None where it binds no local."""
    from harness.gate.read.reach.neutral import _locals

    names = [n for n in _locals(fn) if not n.startswith("_")]
    if not names:
        return None
    name = names[0]

    def build(t=t, fn=fn, name=name):
        node: Any = ast.parse(ast.unparse(fn)).body[0]
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id == name:
                n.id = f"{name}_renamed"
        return replace_node(t, fn, ast.unparse(node))

    return build


def _logger_of(c: Candidates, rel: str) -> str | None:
    """The module's logger: a top-level name bound by assignment whose name says it logs (vLLM's `logger`)."""
    tree = c.tree(rel)
    bound = {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and "log" in t.id.lower()
    }
    return "logger" if "logger" in bound else next(iter(sorted(bound)), None)


def neutral_code_edits(c: Candidates, watched: list[Site]) -> None:
    """local-rename (a local renamed consistently in a watched function) and log-line (a debug line on the module's
    logger at its top): neutral by the gate's rule (harness.gate.read.reach.neutral)."""
    for s in watched:
        t = c.text(s.file)
        _, fn = c.node(s)
        if fn is None or not fn.body:
            continue
        where = f"{s.file}:{s.line} {(s.cls + '.') if s.cls else ''}{s.fn}"
        renamed = _renamed_local(t, fn)
        if renamed is not None:
            c.add("local-rename", s.file, where, renamed)
        logger = _logger_of(c, s.file)
        if logger is not None:
            line = f'{logger}.debug("a line the mutation suite added: %s", {fn.args.args[0].arg if fn.args.args else "None"})'
            c.add("log-line", s.file, where, lambda t=t, fn=fn, line=line: insert_at_top(t, fn, line))
