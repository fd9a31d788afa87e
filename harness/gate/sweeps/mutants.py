"""The gate judged the way mutation testing judges a test suite: one-change copies of real vLLM releases.

Each operator applies one kind of change a nightly brings, at every eligible site of a real release's sources
(sampled to a budget, deterministically), and the gate runs on the release against its copy. A protocol mutant
must not come back SAFE (flagged); a neutral one must (a false alarm otherwise). Operators:

protocol
* `insert-executor-call`: a new set-up step `self.model_executor.<step>()` at the top of an EngineCore function on
  the set-up path;
* `insert-helper-call`: the same step in a new helper method of the class, called at the top of a function on the
  set-up or worker path (EngineCore, the executor, the worker, the runner);
* `insert-rpc-by-name`: the step sent by name, `collective_rpc("<step>")`, from an EngineCore or executor function;
* `rename-attribute`: an attribute the harness's shims or speculators read, renamed where a worker, runner or
  input batch assigns it on its construction path;
* `add-sort`: the scheduler's running requests or a step's scheduled-token map sorted by size, at the top of a
  function on the request path (scheduler, input batch, runner);
* `move-sort`: where a runner already sorts a step's requests (0.34's V2 runner), the sort removed there and put
  into `Scheduler.schedule`.

neutral
* `docstring-edit`, `comment-edit`: text only, in a function on a watched path;
* `optional-kwarg`: a keyword-only parameter with a default added to a function on a watched path, body unchanged;
* `new-module`: a module nothing imports.

The sites come from the release itself (its set-up, worker and request paths as `harness.gate.read.reach` draws them, the
attribute definitions, the functions that touch a step's requests), so an operator is applied wherever its kind of
change can land, not where the gate was tuned. A mutant whose source no longer parses is dropped (counted).
"""

from __future__ import annotations

import ast
import json
import os
import random
import shutil
import tempfile
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

STEP = "mutant_new_setup_step"
PROTOCOL = (
    "insert-executor-call",
    "insert-helper-call",
    "insert-rpc-by-name",
    "rename-attribute",
    "add-sort",
    "move-sort",
)
NEUTRAL = ("docstring-edit", "comment-edit", "optional-kwarg", "new-module")
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


# -- editing source text -------------------------------------------------------------------------------------
def _indent_of(lines: list[str], lineno: int) -> str:
    line = lines[lineno - 1]
    return line[: len(line) - len(line.lstrip())]


def _first_body_line(fn) -> int:
    """Where a statement can go first in `fn` (after its docstring)."""
    body = fn.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(getattr(body[0], "value", None), ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[1].lineno if len(body) > 1 else body[0].end_lineno + 1
    return body[0].lineno


def insert_at_top(text: str, fn, statement: str) -> str:
    lines = text.splitlines(keepends=True)
    at = _first_body_line(fn)
    indent = _indent_of(lines, fn.body[0].lineno)
    lines.insert(at - 1, textwrap.indent(statement.rstrip() + "\n", indent))
    return "".join(lines)


def add_method(text: str, cls: ast.ClassDef, source: str) -> str:
    lines = text.splitlines(keepends=True)
    indent = _indent_of(lines, cls.body[0].lineno)
    lines.insert(cls.end_lineno, "\n" + textwrap.indent(source.rstrip() + "\n", indent))
    return "".join(lines)


def replace_node(text: str, node, new_source: str) -> str:
    lines = text.splitlines(keepends=True)
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    indent = _indent_of(lines, start)
    lines[start - 1 : node.end_lineno] = [textwrap.indent(new_source.rstrip() + "\n", indent)]
    return "".join(lines)


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except SyntaxError:
        return False


# -- sites ---------------------------------------------------------------------------------------------------
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


# -- operators -----------------------------------------------------------------------------------------------
def generate(release: str, root: Path, per_operator: int, seed: int = 2026) -> tuple[list[Mutant], int]:
    """Mutants of one release, at most `per_operator` per operator (a seeded sample of its sites); and how many
    candidate mutants were dropped because their source did not parse."""
    rng = random.Random(f"{seed}-{release}")
    setup = _path_sites(root, ("kvlayout",))
    worker = _path_sites(root, ("runtime",))
    request = _path_sites(root, ("chunkedprefill",))
    watched = _path_sites(root, ("kvlayout", "runtime", "twophase", "chunkedprefill"))
    texts: dict[str, str] = {}

    def text(rel: str) -> str:
        if rel not in texts:
            texts[rel] = (root / rel).read_text(encoding="utf-8")
        return texts[rel]

    candidates: dict[str, list[tuple]] = {op: [] for op in PROTOCOL + NEUTRAL}
    parsed: dict[str, ast.Module] = {}

    def tree(rel: str) -> ast.Module:
        if rel not in parsed:
            parsed[rel] = ast.parse(text(rel))
        return parsed[rel]

    def add(op: str, rel: str, where: str, build) -> None:
        """`build()` makes the mutated text: only the sampled candidates are built."""
        candidates[op].append((rel, where, build))

    engine = [s for s in setup if s.cls == "EngineCore"]
    executor_like = [s for s in setup if s.cls and "Executor" in s.cls]
    for s in engine + executor_like + [w for w in worker if w.cls]:
        t = text(s.file)
        cls, fn = _node(tree(s.file), s)
        if fn is None or not fn.body:
            continue
        where = f"{s.file}:{s.line} {s.cls}.{s.fn}"
        call = "self.model_executor" if s.cls == "EngineCore" else "self"  # who sends a step by name
        if s in engine:
            add(
                "insert-executor-call",
                s.file,
                where,
                lambda t=t, fn=fn: insert_at_top(t, fn, f"self.model_executor.{STEP}()"),
            )
        if s in engine or s in executor_like:
            add(
                "insert-rpc-by-name",
                s.file,
                where,
                lambda t=t, fn=fn, call=call: insert_at_top(t, fn, f'{call}.collective_rpc("{STEP}")'),
            )
        if s.cls == "EngineCore":
            step = f"self.model_executor.{STEP}()"
        elif "Executor" in s.cls:
            step = f'self.collective_rpc("{STEP}")'
        elif "Runner" in s.cls:
            step = f"self.model.{STEP}()"
        else:
            step = f"self.model_runner.{STEP}()"
        helper = f"def _mutant_helper(self):\n    {step}\n"

        def helped(t=t, cls=cls, s=s, helper=helper):
            with_helper = add_method(t, cls, helper)
            _, fn2 = _node(ast.parse(with_helper), s)
            return insert_at_top(with_helper, fn2, "self._mutant_helper()")

        add("insert-helper-call", s.file, where, helped)
    # rename-attribute: definitions on the construction path of the worker, runner and input batch classes
    from harness.vllm_source import runners

    for s in worker:
        if not s.cls or s.fn not in runners.CONSTRUCTION + ("init_device",):
            continue
        t = text(s.file)
        _, fn = _node(tree(s.file), s)
        if fn is None:
            continue
        for n in ast.walk(fn):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            for tg in targets:
                if (
                    isinstance(tg, ast.Attribute)
                    and getattr(tg.value, "id", None) == "self"
                    and tg.attr in READ_ATTRIBUTES
                ):
                    lines = t.splitlines(keepends=True)
                    line = lines[tg.lineno - 1]
                    col = tg.end_col_offset - len(tg.attr)
                    if line[col : tg.end_col_offset] != tg.attr:
                        continue
                    lines[tg.lineno - 1] = line[:col] + tg.attr + "_renamed" + line[tg.end_col_offset :]
                    renamed = "".join(lines)
                    add(
                        "rename-attribute",
                        s.file,
                        f"{s.file}:{tg.lineno} {s.cls}.{tg.attr}",
                        lambda renamed=renamed: renamed,
                    )
    # add-sort / move-sort on the request path
    for s in request:
        t = text(s.file)
        _, fn = _node(tree(s.file), s)
        if fn is None or not fn.body:
            continue
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        where = f"{s.file}:{s.line} {s.cls}.{s.fn}"
        if s.cls == "Scheduler":
            stmt = "self.running.sort(key=lambda r: r.num_tokens)"
        elif "scheduler_output" in params:
            stmt = (
                "scheduler_output.num_scheduled_tokens = dict(sorted("
                "scheduler_output.num_scheduled_tokens.items(), key=lambda kv: kv[1]))"
            )
        elif s.cls and "InputBatch" in s.cls:
            stmt = "self._req_ids.sort(key=str)"
        else:
            continue
        add("add-sort", s.file, where, lambda t=t, fn=fn, stmt=stmt: insert_at_top(t, fn, stmt))
    for worker_module in runners.WORKERS:
        for r in runners.read(str(root), worker_module).defaults:
            if not r.sorts_steps:
                continue
            rel, _, line = r.sorts_steps.rpartition(":")
            sched = next((s for s in request if s.cls == "Scheduler" and s.fn == "schedule"), None)
            if sched is None:
                continue
            t = text(rel)
            for n in ast.walk(tree(rel)):
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "sorted" and n.lineno == int(line):
                    st = text(sched.file)
                    _, fn = _node(tree(sched.file), sched)
                    moved = insert_at_top(st, fn, "self.running.sort(key=lambda r: r.num_tokens)")
                    # two files: the runner without its sort (the mutant's source), the scheduler with one (extra)
                    add(
                        "move-sort",
                        rel,
                        f"{r.sorts_steps} -> {sched.file}:{sched.line}",
                        lambda t=t, n=n, moved=moved, sched=sched: (
                            replace_span(t, n, f"list({ast.unparse(n.args[0])})"),
                            {sched.file: moved},
                        ),
                    )
    # neutral
    for s in watched:
        t = text(s.file)
        cls, fn = _node(tree(s.file), s)
        if fn is None or not fn.body:
            continue
        where = f"{s.file}:{s.line} {(s.cls + '.') if s.cls else ''}{s.fn}"
        first = fn.body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(getattr(first, "value", None), ast.Constant)
            and isinstance(first.value.value, str)
        ):
            lines = t.splitlines(keepends=True)
            indent = _indent_of(lines, first.lineno)
            lines[first.lineno - 1 : first.end_lineno] = [f'{indent}"""Reworded by the mutation suite: same code."""\n']
            reworded = "".join(lines)
            add("docstring-edit", s.file, where, lambda reworded=reworded: reworded)
        else:
            add(
                "docstring-edit",
                s.file,
                where,
                lambda t=t, fn=fn: insert_at_top(t, fn, '"""Added by the mutation suite."""'),
            )
        add(
            "comment-edit",
            s.file,
            where,
            lambda t=t, fn=fn: insert_at_top(t, fn, "# a comment the mutation suite added"),
        )

        def optional(t=t, fn=fn):
            node = ast.parse(ast.unparse(fn)).body[0]
            node.args.kwonlyargs.append(ast.arg("mutant_optional"))
            node.args.kw_defaults.append(ast.Constant(None))
            return replace_node(t, fn, ast.unparse(node))

        add("optional-kwarg", s.file, where, optional)
    for i, pkg in enumerate(("vllm/v1/engine", "vllm/v1/worker", "vllm/v1/core/sched", "vllm/v1/executor")):
        if (root / pkg).is_dir():
            rel = f"{pkg}/mutant_unrelated_{i}.py"
            add(
                "new-module",
                rel,
                rel,
                lambda: (
                    '"""Nothing imports this."""\n\n\nclass Unrelated:\n'
                    "    def run(self):\n        return sorted([3, 1, 2])\n"
                ),
            )
    out, dropped = [], 0
    for op, found in candidates.items():
        found = sorted(found, key=lambda c: c[1])
        rng.shuffle(found)
        kept: list[Mutant] = []
        for rel, where, build in found:
            if len(kept) == per_operator:
                break
            built = build()
            source, extra = built if isinstance(built, tuple) else (built, {})
            if not _parses(source) or not all(_parses(x) for x in extra.values()):
                dropped += 1
                continue
            kept.append(Mutant(release, op, op in PROTOCOL, rel, where, source, extra=extra))
        out += sorted(kept, key=lambda m: m.site)
    return out, dropped


def replace_span(text: str, node, new: str) -> str:
    lines = text.splitlines(keepends=True)
    if node.lineno == node.end_lineno:
        line = lines[node.lineno - 1]
        lines[node.lineno - 1] = line[: node.col_offset] + new + line[node.end_col_offset :]
        return "".join(lines)
    first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
    lines[node.lineno - 1 : node.end_lineno] = [first[: node.col_offset] + new + last[node.end_col_offset :]]
    return "".join(lines)


# -- running the gate on a mutant ----------------------------------------------------------------------------
def materialise(root: Path, m: Mutant, into: Path) -> Path:
    """A copy of `root` (hard links: cheap) with the mutant's file(s) written anew."""
    tree = into / "tree"
    shutil.copytree(root, tree, copy_function=os.link)
    files = {m.file: m.source, **m.extra}
    for rel, source in files.items():
        target = tree / rel
        if target.exists():
            target.unlink()  # a hard link: never write through it into the cached release
        target.write_text(source, encoding="utf-8")
    return tree


_BASELINE: dict = {}


def _top_names(text: str) -> set[str]:
    names = set()
    for n in ast.parse(text).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                names |= {e.id for e in ast.walk(t) if isinstance(e, ast.Name)}
    return names


def baseline(root: str, fixture: str) -> tuple:
    """The release's facts, the files they were read from (relative) and the names searched across the tree."""
    from harness.gate.read import static
    from harness.vllm_source import runners, tree

    if root not in _BASELINE:
        runners.read.cache_clear()
        runners.v2_by_default.cache_clear()
        tree.READ["files"].clear()
        tree.READ["names"].clear()
        facts = static.version_facts(root, fixture)
        base = Path(root).resolve()
        files = {str(Path(f).relative_to(base)) for f in tree.READ["files"] if Path(f).is_relative_to(base)}
        _BASELINE[root] = (facts, files, set(tree.READ["names"]))
    return _BASELINE[root]


def same_facts(root: str, m: Mutant, read_files: set, names: set) -> bool:
    """Whether the mutant leaves every input of the release's facts as it was: no file they were read from is
    changed, and no name they searched the tree for is defined or undefined anew."""
    for rel, source in {m.file: m.source, **m.extra}.items():
        if rel in read_files:
            return False
        original = Path(root, rel)
        before = _top_names(original.read_text(encoding="utf-8")) if original.exists() else set()
        if (before ^ _top_names(source)) & names:
            return False
    return True


def judge(root: str, fixture: str, m: Mutant) -> Mutant:
    """The gate's verdict on release -> mutant (static reading and watched paths, as `harness gate` runs it). The
    facts are read anew only where the mutant touches what the release's facts were read from."""
    import datetime as _dt

    from harness import contracts
    from harness.gate.decide import allowlist, verdict
    from harness.gate.read import reach, static

    base_facts, read_files, names = baseline(root, fixture)
    with tempfile.TemporaryDirectory(prefix="harness-mutant-") as tmp:
        tree = materialise(Path(root), m, Path(tmp))
        try:
            facts = base_facts if same_facts(root, m, read_files, names) else static.version_facts(str(tree), fixture)
            comparison = static.compare(base_facts, facts)
            paths = reach.review(Path(root), tree, comparison.findings)
            gate = verdict.decide(
                m.release,
                f"{m.release}+mutant",
                comparison,
                contracts.ids(),
                allowlist.load(None),
                _dt.date.today(),
                None,
                "not requested",
                paths,
            )
        except Exception as exc:  # noqa: BLE001 - a crash on a mutant is a result to report, not a stop
            m.verdict, m.exit_code, m.reason = "ERROR", 2, f"{type(exc).__name__}: {exc}"[:300]
            return m
    m.verdict, m.exit_code = gate.verdict, gate.exit_code
    why = [f"{f.contract}/{f.kind} {f.symbol} ({f.status})" for f in gate.findings]
    why += [f"changed-unclassified {c.key} ({c.kind}, {c.evidence})" for c in gate.unclassified]
    m.reason = "; ".join(why[:3]) or "no finding: nothing the gate reads changed"
    return m


def run(releases: list[str], per_operator: int, out_json: Path, out_md: Path, workers: int = 2, log=print) -> dict:
    from harness.envs import sources
    from harness.vllm_source import used_surface

    fixture = str(used_surface.fixture_path("0.3.0"))
    started = time.perf_counter()
    mutants, dropped, roots = [], 0, {}
    for r in releases:
        root = sources.ensure(r).root
        roots[r] = str(root)
        found, d = generate(r, root, per_operator)
        mutants += found
        dropped += d
        log(f"gate mutants: {r}: {len(found)} mutants ({d} candidates dropped: did not parse)")
    args = [(roots[m.release], fixture, m) for m in mutants]
    done: list[Mutant] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, m in enumerate(pool.map(judge, *zip(*args, strict=True)), 1):
            done.append(m)
            if i % 20 == 0 or i == len(args):
                log(f"gate mutants: {i}/{len(args)} judged")
    report = summarise(done, releases, dropped, round(time.perf_counter() - started, 1), per_operator)
    from harness.support.report_files import write_atomic

    write_atomic(out_json, json.dumps(report, indent=2) + "\n")
    write_atomic(out_md, markdown(report))
    return report


def summarise(done: list[Mutant], releases: list[str], dropped: int, seconds: float, per_operator: int) -> dict:
    ops = {}
    for op in PROTOCOL + NEUTRAL:
        mine = [m for m in done if m.operator == op]
        flagged = [m for m in mine if m.verdict not in ("SAFE",)]
        ops[op] = {
            "protocol": op in PROTOCOL,
            "mutants": len(mine),
            "flagged": len(flagged),
            "releases": sorted({m.release for m in mine}),
        }
    protocol = [m for m in done if m.protocol]
    neutral = [m for m in done if not m.protocol]
    missed = [m for m in protocol if m.verdict == "SAFE"]
    alarms = [m for m in neutral if m.verdict != "SAFE"]
    return {
        "schema": "harness-gate-mutants/1",
        "releases": releases,
        "per_operator": per_operator,
        "mutants": len(done),
        "operators": len([o for o in ops.values() if o["mutants"]]),
        "dropped_unparsable": dropped,
        "protocol": {
            "mutants": len(protocol),
            "flagged": len(protocol) - len(missed),
            "detection": round((len(protocol) - len(missed)) / len(protocol), 4) if protocol else None,
        },
        "neutral": {"mutants": len(neutral), "false_alarms": len(alarms)},
        "by_operator": ops,
        "verdicts": {v: sum(m.verdict == v for m in done) for v in sorted({m.verdict for m in done})},
        "missed": [_row(m) for m in missed],
        "false_alarms": [_row(m) for m in alarms],
        "all": [_row(m) for m in done],
        "seconds": seconds,
    }


def _row(m: Mutant) -> dict:
    d = asdict(m)
    d.pop("source")
    d.pop("extra")
    return d


def markdown(rep: dict) -> str:
    p, n = rep["protocol"], rep["neutral"]
    lines = [
        f"# The gate against one-change mutants of vLLM {', '.join(rep['releases'])}",
        "",
        f"{rep['mutants']} mutants, {rep['operators']} operators (at most {rep['per_operator']} per operator and "
        f"release, a seeded sample of each operator's sites); {rep['dropped_unparsable']} candidates dropped "
        f"because they did not parse. Protocol mutants flagged (not SAFE): **{p['flagged']}/{p['mutants']}"
        f"** ({(p['detection'] or 0) * 100:.1f} %); neutral mutants flagged: **{n['false_alarms']}/"
        f"{n['mutants']}**. Verdicts: " + ", ".join(f"{k} {v}" for k, v in rep["verdicts"].items()) + ".",
        "",
        "| operator | kind | releases | mutants | flagged | missed / false alarms |",
        "|---|---|---|---|---|---|",
    ]
    for op, o in rep["by_operator"].items():
        bad = o["mutants"] - o["flagged"] if o["protocol"] else o["flagged"]
        lines.append(
            f"| {op} | {'protocol' if o['protocol'] else 'neutral'} | {', '.join(o['releases'])} | "
            f"{o['mutants']} | {o['flagged']} | {bad} |"
        )
    lines.append("")
    for title, rows in (
        ("Missed protocol mutants (came back SAFE)", rep["missed"]),
        ("Neutral mutants flagged (false alarms)", rep["false_alarms"]),
    ):
        lines += [f"## {title}", ""]
        lines += [
            f"- {r['release']} {r['operator']} at `{r['site']}`: {r['verdict']}; {r['reason']}" for r in rows
        ] or ["None."]
        lines.append("")
    return "\n".join(lines)
