"""The protocol operators that hide a new step behind an indirection (harness.vllm_source.indirection): the step of
insert-helper-call, run by a decorator this module defines, a mixin base class's method, `getattr(self, NAME)()`
with a module constant, or a property the function reads. Each runs as surely as a direct call, so the gate must
flag each (the mutation report counts a SAFE one as missed)."""

from __future__ import annotations

from harness.gate.sweeps.mutants.edits import add_method, indent_of, insert_at_top
from harness.gate.sweeps.mutants.operators import INDIRECT, Candidates, Site, _step_in


def _before_class(text: str, cls, source: str) -> str:
    """`source` at module level just above the class (and its decorators)."""
    lines = text.splitlines(keepends=True)
    at = min([cls.lineno] + [d.lineno for d in cls.decorator_list]) - 1
    lines.insert(at, source.rstrip() + "\n\n\n")
    return "".join(lines)


def _decorated(text: str, fn, name: str) -> str:
    """`@name` as the outermost decorator of `fn`."""
    lines = text.splitlines(keepends=True)
    at = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    lines.insert(at - 1, f"{indent_of(lines, at)}@{name}\n")
    return "".join(lines)


def _with_base(text: str, cls, base: str) -> str | None:
    """The class header with `base` first among its bases; None where the header is not on one line as expected."""
    lines = text.splitlines(keepends=True)
    line = lines[cls.lineno - 1]
    head = f"class {cls.name}"
    if f"{head}(" in line:
        lines[cls.lineno - 1] = line.replace(f"{head}(", f"{head}({base}, ", 1)
    elif f"{head}:" in line:
        lines[cls.lineno - 1] = line.replace(f"{head}:", f"{head}({base}):", 1)
    else:
        return None
    return "".join(lines)


def _builders(t: str, cls, fn, step: str) -> dict:
    """Operator -> a builder of the mutated text. Edits go bottom up (the function, then its class, then above it),
    so each one's line numbers still hold."""

    def decorator():
        deco = (
            "def _mutant_deco(fn):\n"
            "    def wrapper(self, *args, **kwargs):\n"
            f"        {step}\n"
            "        return fn(self, *args, **kwargs)\n"
            "    return wrapper\n"
        )
        return _before_class(_decorated(t, fn, "_mutant_deco"), cls, deco)

    def mixin():
        called = _with_base(insert_at_top(t, fn, "self._mutant_step()"), cls, "_MutantMixin")
        mix = f"class _MutantMixin:\n    def _mutant_step(self):\n        {step}\n"
        return _before_class(called or "", cls, mix)

    def by_getattr():
        helper = add_method(t, cls, f"def _mutant_helper(self):\n    {step}\n")
        called = insert_at_top(helper, fn, "getattr(self, _MUTANT_STEP)()")
        return _before_class(called, cls, '_MUTANT_STEP = "_mutant_helper"\n')

    def prop():
        helper = add_method(t, cls, f"@property\ndef _mutant_ready(self):\n    {step}\n    return True\n")
        return insert_at_top(helper, fn, "assert self._mutant_ready")

    out = dict(zip(INDIRECT, (decorator, mixin, by_getattr, prop), strict=True))
    if _with_base(t, cls, "_MutantMixin") is None:  # a class header this edit cannot extend: no mixin mutant here
        del out["step-in-mixin"]
    return out


def indirect_steps(c: Candidates, setup: list[Site], worker: list[Site]) -> None:
    """Each indirection operator at every EngineCore set-up site and every worker-path method (where
    insert-helper-call goes)."""
    for s in [x for x in setup if x.cls == "EngineCore"] + [w for w in worker if w.cls]:
        t = c.text(s.file)
        cls, fn = c.node(s)
        if cls is None or fn is None or not fn.body:
            continue
        where = f"{s.file}:{s.line} {s.cls}.{s.fn}"
        for op, build in _builders(t, cls, fn, _step_in(s.cls or "")).items():
            c.add(op, s.file, where, build)
