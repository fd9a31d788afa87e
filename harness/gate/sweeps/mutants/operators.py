"""The operators: where in a release each kind of change can land, and the mutants made there.

`generate` finds every candidate site of each operator in the release's own sources (its set-up, worker and request
paths as `harness.gate.read.reach` draws them), samples at most `per_operator` of them per operator with a seeded
generator, and only then builds the sampled mutants' sources (harness.gate.sweeps.mutants.edits)."""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.gate.sweeps.mutants.edits import add_method, indent_of, insert_at_top, parses, replace_node, replace_span

STEP = "mutant_new_setup_step"
#: The new step behind an indirection (harness.gate.sweeps.mutants.indirect_edits).
INDIRECT = ("step-behind-decorator", "step-in-mixin", "step-by-getattr", "step-in-property")
PROTOCOL = (
    "insert-executor-call",
    "insert-helper-call",
    "insert-rpc-by-name",
    "rename-attribute",
    "add-sort",
    "move-sort",
    "override-step",
    "kwarg-absorbed",
    *INDIRECT,
)
NEUTRAL = ("docstring-edit", "comment-edit", "optional-kwarg", "new-module", "local-rename", "log-line")
#: Attributes read on the worker, runner and input batch by speculators 0.3.0 and the harness's shims.
READ_ATTRIBUTES = (
    "model_runner",
    "model",
    "input_batch",
    "req_ids",
    "kv_caches",
    "requests",
    "req_id_to_index",
    "vllm_config",
    "device",
)


@dataclass
class Mutant:
    release: str
    operator: str
    protocol: bool
    file: str  # relative to the release's root
    site: str  # function or attribute, file:line
    source: str  # the mutated file's text (new-module: the new file)
    extra: dict = field(default_factory=dict)  # other files the mutant changes (move-sort: the scheduler)
    verdict: str = ""
    exit_code: int = -1
    reason: str = ""  # what flagged it, or why it survived


@dataclass
class Site:
    file: str
    cls: str | None
    fn: str
    line: int


def _path_sites(root: Path, contracts: tuple[str, ...]) -> list[Site]:
    """The functions the named contracts' watched paths follow in this release (both platforms)."""
    from harness.gate.read import reach

    index = reach.Index(root)
    out: dict[tuple, Site] = {}
    for platform in reach.platform_roles(root, index):
        for c in contracts:
            entries, enter = reach.WATCH[c]
            for key, (fn, _, followed) in reach.reachable(index, platform, entries, enter).items():
                if followed:
                    qual = key.split(":")[1]
                    cls, _, name = qual.rpartition(".")
                    out.setdefault((fn.file, qual), Site(fn.file, cls or None, name, fn.line))
    return sorted(out.values(), key=lambda s: (s.file, s.line))


def _node(tree: ast.Module, site: Site):
    scope = tree.body
    if site.cls:
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == site.cls), None)
        if cls is None:
            return None, None
        scope = cls.body
    else:
        cls = None
    fn = next(
        (
            n
            for n in scope
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == site.fn and n.lineno == site.line
        ),
        None,
    )
    return cls, fn


class Candidates:
    """A release's sources, each read and parsed once, and every operator's candidate mutants: (file, where, build),
    where `build()` makes the mutated text (a file's text, or it and {other file: text})."""

    def __init__(self, root: Path):
        self.root = root
        self.found: dict[str, list[tuple]] = {op: [] for op in PROTOCOL + NEUTRAL}
        self._texts: dict[str, str] = {}
        self._trees: dict[str, ast.Module] = {}

    def text(self, rel: str) -> str:
        if rel not in self._texts:
            self._texts[rel] = (self.root / rel).read_text(encoding="utf-8")
        return self._texts[rel]

    def tree(self, rel: str) -> ast.Module:
        if rel not in self._trees:
            self._trees[rel] = ast.parse(self.text(rel))
        return self._trees[rel]

    def node(self, site: Site):
        return _node(self.tree(site.file), site)

    def add(self, op: str, rel: str, where: str, build) -> None:
        self.found[op].append((rel, where, build))

    def functions(self, sites: list[Site]):
        """(site, its file's text, its def node, where) for each site whose function has a body."""
        for s in sites:
            _, fn = self.node(s)
            if fn is not None and fn.body:
                yield s, self.text(s.file), fn, f"{s.file}:{s.line} {(s.cls + '.') if s.cls else ''}{s.fn}"


def _step_in(cls_name: str) -> str:
    """How a function of this class runs the new set-up step on its own object."""
    if cls_name == "EngineCore":
        return f"self.model_executor.{STEP}()"
    if "Executor" in cls_name:
        return f'self.collective_rpc("{STEP}")'
    if "Runner" in cls_name:
        return f"self.model.{STEP}()"
    return f"self.model_runner.{STEP}()"


def new_steps(c: Candidates, setup: list[Site], worker: list[Site]) -> None:
    """insert-executor-call, insert-rpc-by-name and insert-helper-call on the set-up and worker paths."""
    engine = [s for s in setup if s.cls == "EngineCore"]
    executor_like = [s for s in setup if s.cls and "Executor" in s.cls]
    for s in engine + executor_like + [w for w in worker if w.cls]:
        t = c.text(s.file)
        cls, fn = c.node(s)
        if fn is None or not fn.body:
            continue
        where = f"{s.file}:{s.line} {s.cls}.{s.fn}"
        call = "self.model_executor" if s.cls == "EngineCore" else "self"  # who sends a step by name
        if s in engine:
            c.add(
                "insert-executor-call",
                s.file,
                where,
                lambda t=t, fn=fn: insert_at_top(t, fn, f"self.model_executor.{STEP}()"),
            )
        if s in engine or s in executor_like:
            c.add(
                "insert-rpc-by-name",
                s.file,
                where,
                lambda t=t, fn=fn, call=call: insert_at_top(t, fn, f'{call}.collective_rpc("{STEP}")'),
            )
        helper = f"def _mutant_helper(self):\n    {_step_in(s.cls or '')}\n"  # every site here has a class

        def helped(t=t, cls=cls, s=s, helper=helper):
            with_helper = add_method(t, cls, helper)
            _, fn2 = _node(ast.parse(with_helper), s)
            return insert_at_top(with_helper, fn2, "self._mutant_helper()")

        c.add("insert-helper-call", s.file, where, helped)


def _assigned_read_attributes(fn):
    """The `self.<attr> = ...` targets in `fn` whose attribute speculators or the shims read."""
    for n in ast.walk(fn):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        for tg in targets:
            if isinstance(tg, ast.Attribute) and getattr(tg.value, "id", None) == "self" and tg.attr in READ_ATTRIBUTES:
                yield tg


def renamed_attributes(c: Candidates, worker: list[Site]) -> None:
    """rename-attribute: definitions on the construction path of the worker, runner and input batch classes."""
    from harness.vllm_source import runners

    for s in worker:
        if not s.cls or s.fn not in runners.CONSTRUCTION + ("init_device",):
            continue
        t = c.text(s.file)
        _, fn = c.node(s)
        if fn is None:
            continue
        for tg in _assigned_read_attributes(fn):
            lines = t.splitlines(keepends=True)
            line = lines[tg.lineno - 1]
            col = tg.end_col_offset - len(tg.attr)
            if line[col : tg.end_col_offset] != tg.attr:
                continue
            lines[tg.lineno - 1] = line[:col] + tg.attr + "_renamed" + line[tg.end_col_offset :]
            renamed = "".join(lines)
            c.add(
                "rename-attribute", s.file, f"{s.file}:{tg.lineno} {s.cls}.{tg.attr}", lambda renamed=renamed: renamed
            )


def _sort_for(s: Site, fn) -> str | None:
    """The statement that sorts a step's requests by size at the top of `fn`, in its class's terms (None: none)."""
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    if s.cls == "Scheduler":
        return "self.running.sort(key=lambda r: r.num_tokens)"
    if "scheduler_output" in params:
        return (
            "scheduler_output.num_scheduled_tokens = dict(sorted("
            "scheduler_output.num_scheduled_tokens.items(), key=lambda kv: kv[1]))"
        )
    if s.cls and "InputBatch" in s.cls:
        return "self._req_ids.sort(key=str)"
    return None


def added_sorts(c: Candidates, request: list[Site]) -> None:
    """add-sort at the top of each function on the request path that can sort a step's requests."""
    for s in request:
        t = c.text(s.file)
        _, fn = c.node(s)
        if fn is None or not fn.body:
            continue
        stmt = _sort_for(s, fn)
        if stmt is not None:
            where = f"{s.file}:{s.line} {s.cls}.{s.fn}"
            c.add("add-sort", s.file, where, lambda t=t, fn=fn, stmt=stmt: insert_at_top(t, fn, stmt))


def moved_sorts(c: Candidates, request: list[Site]) -> None:
    """move-sort: where a runner sorts a step's requests, that sort removed and one put into Scheduler.schedule."""
    from harness.vllm_source import runners

    sched = next((s for s in request if s.cls == "Scheduler" and s.fn == "schedule"), None)
    if sched is None:
        return
    for worker_module in runners.WORKERS:
        for r in runners.read(str(c.root), worker_module).defaults:
            if not r.sorts_steps:
                continue
            rel, _, line = r.sorts_steps.rpartition(":")
            t = c.text(rel)
            for n in ast.walk(c.tree(rel)):
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "sorted" and n.lineno == int(line):
                    _, fn = c.node(sched)
                    moved = insert_at_top(c.text(sched.file), fn, "self.running.sort(key=lambda r: r.num_tokens)")
                    # two files: the runner without its sort (the mutant's source), the scheduler with one (extra)
                    c.add(
                        "move-sort",
                        rel,
                        f"{r.sorts_steps} -> {sched.file}:{sched.line}",
                        lambda t=t, n=n, moved=moved, sched=sched: (
                            replace_span(t, n, f"list({ast.unparse(n.args[0])})"),
                            {sched.file: moved},
                        ),
                    )


def _reworded_docstring(t: str, fn):
    """The text with `fn`'s docstring reworded, or with one added where it has none (a builder)."""
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = t.splitlines(keepends=True)
        indent = indent_of(lines, first.lineno)
        lines[first.lineno - 1 : first.end_lineno] = [f'{indent}"""Reworded by the mutation suite: same code."""\n']
        reworded = "".join(lines)
        return lambda reworded=reworded: reworded
    return lambda t=t, fn=fn: insert_at_top(t, fn, '"""Added by the mutation suite."""')


def neutral_edits(c: Candidates, watched: list[Site]) -> None:
    """docstring-edit, comment-edit and optional-kwarg in each function on a watched path."""
    for s, t, fn, where in c.functions(watched):
        c.add("docstring-edit", s.file, where, _reworded_docstring(t, fn))
        c.add(
            "comment-edit",
            s.file,
            where,
            lambda t=t, fn=fn: insert_at_top(t, fn, "# a comment the mutation suite added"),
        )

        def optional(t=t, fn=fn):
            node: Any = ast.parse(ast.unparse(fn)).body[0]  # the function again: a def
            node.args.kwonlyargs.append(ast.arg("mutant_optional"))
            node.args.kw_defaults.append(ast.Constant(None))
            return replace_node(t, fn, ast.unparse(node))

        c.add("optional-kwarg", s.file, where, optional)


def new_modules(c: Candidates) -> None:
    """new-module: a module nothing imports, in each of the engine, worker, scheduler and executor packages."""
    for i, pkg in enumerate(("vllm/v1/engine", "vllm/v1/worker", "vllm/v1/core/sched", "vllm/v1/executor")):
        if (c.root / pkg).is_dir():
            rel = f"{pkg}/mutant_unrelated_{i}.py"
            c.add(
                "new-module",
                rel,
                rel,
                lambda: (
                    '"""Nothing imports this."""\n\n\nclass Unrelated:\n'
                    "    def run(self):\n        return sorted([3, 1, 2])\n"
                ),
            )


def sample(release: str, found: dict[str, list[tuple]], per_operator: int, rng: random.Random) -> tuple[list, int]:
    """At most `per_operator` mutants of each operator (a seeded shuffle of its candidates, in site order first),
    built; a candidate whose source does not parse is dropped and counted."""
    out, dropped = [], 0
    for op, candidates in found.items():
        candidates = sorted(candidates, key=lambda c: c[1])
        rng.shuffle(candidates)
        kept: list[Mutant] = []
        for rel, where, build in candidates:
            if len(kept) == per_operator:
                break
            built = build()
            source, extra = built if isinstance(built, tuple) else (built, {})
            if not parses(source) or not all(parses(x) for x in extra.values()):
                dropped += 1
                continue
            kept.append(Mutant(release, op, op in PROTOCOL, rel, where, source, extra=extra))
        out += sorted(kept, key=lambda m: m.site)
    return out, dropped


def generate(release: str, root: Path, per_operator: int, seed: int = 2026) -> tuple[list[Mutant], int]:
    """Mutants of one release, at most `per_operator` per operator (a seeded sample of its sites); and how many
    candidate mutants were dropped because their source did not parse."""
    rng = random.Random(f"{seed}-{release}")
    setup = _path_sites(root, ("kvlayout",))
    worker = _path_sites(root, ("runtime",))
    request = _path_sites(root, ("chunkedprefill",))
    watched = _path_sites(root, ("kvlayout", "runtime", "twophase", "chunkedprefill"))
    c = Candidates(root)
    new_steps(c, setup, worker)
    renamed_attributes(c, worker)
    added_sorts(c, request)
    moved_sorts(c, request)
    neutral_edits(c, watched)
    from harness.gate.sweeps.mutants.code_edits import absorbed_keywords, neutral_code_edits, override_steps
    from harness.gate.sweeps.mutants.indirect_edits import indirect_steps

    neutral_code_edits(c, watched)
    override_steps(c, setup)
    indirect_steps(c, setup, worker)
    absorbed_keywords(c)
    new_modules(c)
    return sample(release, c.found, per_operator, rng)
