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
    for s, t, fn, where in c.functions(watched):
        renamed = _renamed_local(t, fn)
        if renamed is not None:
            c.add("local-rename", s.file, where, renamed)
        logger = _logger_of(c, s.file)
        if logger is not None:
            line = f'{logger}.debug("a line the mutation suite added: %s", {fn.args.args[0].arg if fn.args.args else "None"})'
            c.add("log-line", s.file, where, lambda t=t, fn=fn, line=line: insert_at_top(t, fn, line))


#: speculators 0.3.0's keywords to `Request(...)` (fixtures/surfaces/speculators-0.3.0.json, its one call of it).
REQUEST_MODULE = "vllm/v1/request.py"


def _request_keywords() -> list[str]:
    import json

    from harness.support.paths import FIXTURES

    surface = json.loads((FIXTURES / "surfaces" / "speculators-0.3.0.json").read_text())
    calls = [c for m in surface["modules"].values() for c in m.get("calls", []) if c.get("callee") == "Request"]
    return sorted({k for c in calls for k in c.get("keywords", [])})


def absorbed_keywords(c: Candidates) -> None:
    """kwarg-absorbed: a parameter of Request.__init__ that speculators passes by keyword renamed (`<name>_v2`, made
    optional and moved last) with a `**kwargs` added that never reads it: the call still succeeds, the value is lost."""
    if not (c.root / REQUEST_MODULE).is_file():
        return
    t = c.text(REQUEST_MODULE)
    cls = next((n for n in c.tree(REQUEST_MODULE).body if isinstance(n, ast.ClassDef) and n.name == "Request"), None)
    init = next((n for n in (cls.body if cls else ()) if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None or init.args.kwarg is not None:
        return
    for name in _request_keywords():
        if not any(a.arg == name for a in init.args.args + init.args.kwonlyargs):
            continue

        def build(t=t, init=init, name=name):
            node: Any = ast.parse(ast.unparse(init)).body[0]
            args = node.args
            pos = next((i for i, a in enumerate(args.args) if a.arg == name), None)
            if pos is not None:
                first_default = len(args.args) - len(args.defaults)
                if pos >= first_default:
                    del args.defaults[pos - first_default]
                del args.args[pos]
            else:
                i = next(i for i, a in enumerate(args.kwonlyargs) if a.arg == name)
                del args.kwonlyargs[i], args.kw_defaults[i]
            args.kwonlyargs.append(ast.arg(f"{name}_v2"))
            args.kw_defaults.append(ast.Constant(None))
            args.kwarg = ast.arg("kwargs")
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and n.id == name:
                    n.id = f"{name}_v2"
            return replace_node(t, init, ast.unparse(node))

        c.add("kwarg-absorbed", REQUEST_MODULE, f"{REQUEST_MODULE}:{init.lineno} Request.__init__({name}=)", build)


def override_steps(c: Candidates, setup: list[Site]) -> None:
    """override-step: in EngineCoreProc (the class vLLM's multiprocess engine runs), an override of an EngineCore
    method on the set-up path that runs a new executor step, then the base's method."""
    from harness.gate.sweeps.mutants.edits import add_method
    from harness.gate.sweeps.mutants.operators import STEP

    for s in [s for s in setup if s.cls == "EngineCore" and s.fn != "__init__"]:
        tree = c.tree(s.file)
        proc = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineCoreProc"), None)
        if proc is None or any(isinstance(n, ast.FunctionDef) and n.name == s.fn for n in proc.body):
            continue
        method = (
            f"def {s.fn}(self, *args, **kwargs):\n"
            f"    self.model_executor.{STEP}()\n"
            f"    return super().{s.fn}(*args, **kwargs)\n"
        )
        where = f"{s.file}:{proc.lineno} EngineCoreProc.{s.fn}"
        text = c.text(s.file)
        c.add("override-step", s.file, where, lambda t=text, proc=proc, m=method: add_method(t, proc, m))
