"""Running the gate on a mutant: the release copied with the mutant's files written anew, its facts read again only
where the mutant touched what they were read from, and the verdict `harness gate` would give; `run` judges every
mutant of the releases in a process pool and writes the report (harness.gate.sweeps.mutants.report)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from harness.gate.sweeps.mutants.operators import Mutant, generate
from harness.gate.sweeps.mutants.report import markdown, summarise


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
    from harness.vllm_source import runners, source_files

    if root not in _BASELINE:
        runners.read.cache_clear()
        runners.v2_by_default.cache_clear()
        source_files.READ["files"].clear()
        source_files.READ["names"].clear()
        facts = static.version_facts(root, fixture)
        base = Path(root).resolve()
        files = {str(Path(f).relative_to(base)) for f in source_files.READ["files"] if Path(f).is_relative_to(base)}
        _BASELINE[root] = (facts, files, set(source_files.READ["names"]))
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
