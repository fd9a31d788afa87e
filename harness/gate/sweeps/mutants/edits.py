"""Editing a release's source text the way a mutant changes it: a statement at the top of a function (after its
docstring), a method added to a class, a node or a span replaced, indentation kept."""

from __future__ import annotations

import ast
import textwrap


def indent_of(lines: list[str], lineno: int) -> str:
    line = lines[lineno - 1]
    return line[: len(line) - len(line.lstrip())]


def _first_body_line(fn) -> int:
    """Where a statement can go first in `fn` (after its docstring)."""
    body = fn.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1].lineno if len(body) > 1 else (first.end_lineno or first.lineno) + 1
    return first.lineno


def insert_at_top(text: str, fn, statement: str) -> str:
    lines = text.splitlines(keepends=True)
    at = _first_body_line(fn)
    indent = indent_of(lines, fn.body[0].lineno)
    lines.insert(at - 1, textwrap.indent(statement.rstrip() + "\n", indent))
    return "".join(lines)


def add_method(text: str, cls: ast.ClassDef, source: str) -> str:
    lines = text.splitlines(keepends=True)
    indent = indent_of(lines, cls.body[0].lineno)
    lines.insert(cls.end_lineno or cls.lineno, "\n" + textwrap.indent(source.rstrip() + "\n", indent))
    return "".join(lines)


def replace_node(text: str, node, new_source: str) -> str:
    lines = text.splitlines(keepends=True)
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    indent = indent_of(lines, start)
    lines[start - 1 : node.end_lineno] = [textwrap.indent(new_source.rstrip() + "\n", indent)]
    return "".join(lines)


def parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except SyntaxError:
        return False


def replace_span(text: str, node, new: str) -> str:
    lines = text.splitlines(keepends=True)
    if node.lineno == node.end_lineno:
        line = lines[node.lineno - 1]
        lines[node.lineno - 1] = line[: node.col_offset] + new + line[node.end_col_offset :]
        return "".join(lines)
    first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
    lines[node.lineno - 1 : node.end_lineno] = [first[: node.col_offset] + new + last[node.end_col_offset :]]
    return "".join(lines)
