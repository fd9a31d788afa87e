"""Where a keyword goes once a callee's `**kwargs` takes it: a signature with `**kwargs` accepts every keyword, but
accepting is not using. A keyword speculators passes that the callee renamed is absorbed and silently dropped: the
call succeeds and the value never arrives. So a keyword that lands in `**kwargs` is followed through the body:

* read by its name (`kwargs.pop("k")`, `.get`, `.setdefault`, `kwargs["k"]`, `"k" in kwargs`): used;
* forwarded (`super().__init__(**kwargs)`, `self.m(**kwargs)`): decided by the callee's own signature, followed the
  same way (a bounded number of hops);
* neither, and the mapping is not used otherwise: dropped (the call would lose it);
* the mapping used as a whole (stored, iterated, passed on to something the reading cannot resolve): undecided.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

#: Forwarding hops followed before the fate is undecided.
HOPS = 4
_READS = ("pop", "get", "setdefault")


@dataclass(frozen=True)
class Fate:
    used: bool | None  # True: read or taken by a named parameter downstream; False: dropped; None: undecided
    how: str


def _is(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _reads_key(node, name: str, key: str) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is(node.func.value, name):
        first = node.args[0] if node.args else None
        return node.func.attr in _READS and isinstance(first, ast.Constant) and first.value == key
    if isinstance(node, ast.Subscript) and _is(node.value, name):
        return isinstance(node.slice, ast.Constant) and node.slice.value == key
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
        return isinstance(node.left, ast.Constant) and node.left.value == key and _is(node.comparators[0], name)
    return False


def _forwards(node, name: str) -> bool:
    return isinstance(node, ast.Call) and any(k.arg is None and _is(k.value, name) for k in node.keywords)


def fate(tree, fn, key: str, hops: int = 0) -> Fate:
    """The fate of keyword `key` in griffe function `fn`, whose `**kwargs` takes it."""
    node = tree.node(fn)
    if node is None or node.args.kwarg is None:
        return Fate(None, f"{fn.path}: body not readable")
    name = node.args.kwarg.arg
    walked: list[Any] = list(ast.walk(node))
    if any(_reads_key(n, name, key) for n in walked):
        return Fate(True, f"read by name from **{name} in {fn.path}")
    forwards: list[ast.Call] = [n for n in walked if _forwards(n, name)]
    dropped = None  # the first forward's fate, where every forward drops the keyword
    for call in forwards:
        found = _followed(tree, fn, call, key, hops)
        if found.used is not False:
            return found
        dropped = dropped or found
    loose = _whole_uses(walked, name, forwards)
    if loose:
        return Fate(None, f"**{name} of {fn.path} is used as a whole (line {loose[0].lineno}): not followed")
    if dropped is not None:
        return dropped
    return Fate(False, f"absorbed by **{name} of {fn.path} and never read: the value is dropped")


def _whole_uses(walked: list, name: str, forwards: list[ast.Call]) -> list:
    """Reads of the mapping that are neither a keyed read nor a forward: it is used as a whole."""
    return [
        n
        for n in walked
        if _is(n, name)
        and isinstance(n.ctx, ast.Load)
        and not any(_is(k.value, name) for c in forwards for k in c.keywords if k.value is n)
        and not any(_reads_subject(p, n) for p in walked)
    ]


def _reads_subject(parent, node) -> bool:
    """`node` is the mapping a keyed read reads (`kwargs.pop(...)`, `kwargs[...]`, `... in kwargs`)."""
    if isinstance(parent, ast.Attribute) and parent.value is node:
        return parent.attr in _READS
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return True
    return isinstance(parent, ast.Compare) and any(c is node for c in parent.comparators)


def _followed(tree, fn, call: ast.Call, key: str, hops: int) -> Fate:
    from harness.vllm_source.signatures import signature

    if hops >= HOPS:
        return Fate(None, f"forwarded more than {HOPS} times: not followed")
    target = _callee(tree, fn, call.func)
    if target is None:
        return Fate(None, f"forwarded to {ast.unparse(call.func)} in {fn.path}: not resolved")
    sig = signature(tree, target, bound=True)
    if sig is None:
        return Fate(None, f"forwarded to {target.path}: signature not readable")
    param = sig.named(key)
    if param is not None and param.kind != "positional-only":
        return Fate(True, f"forwarded to {target.path}, which takes {key}=")
    if sig.takes_any_keyword and sig.fn is not None:
        return fate(tree, sig.fn, key, hops + 1)
    return Fate(False, f"forwarded to {target.path}, which does not take {key}=")


def _callee(tree, fn, func: ast.expr):
    """`super().m` and `self.m` resolved from `fn`'s class; anything else is not resolved."""
    cls = fn.parent if fn.parent is not None and fn.parent.is_class else None
    if cls is None or not isinstance(func, ast.Attribute):
        return None
    owner = func.value
    if isinstance(owner, ast.Call) and _is(owner.func, "super"):
        for base in tree.bases(cls):
            found = tree.member(base, func.attr)
            if found is not None and found.is_function:
                return found
        return None
    if _is(owner, "self"):
        found = tree.member(cls, func.attr)
        return found if found is not None and found.is_function else None
    return None
