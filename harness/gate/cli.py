"""`python -m harness gate --to VERSION [--from VERSION]`: can speculators' vLLM move to VERSION?

The static half of the pre-upgrade gate: fetch both versions' sources (cached), read speculators'
used surface in each, map every change to the shim that covers it, decide. Markdown for a CI job
summary goes to stdout (and `--summary FILE`); the JSON report to `reports/gate-<from>-to-<to>.json`
(or `--json FILE`). Exit codes: 0 SAFE or NEEDS-SHIM-AND-COVERED, 1 NEEDS-NEW-SHIM or BROKEN,
3 REVIEW (code on a watched path changed and no check classifies it), 2 could not decide (a version not on the index, no network, unreadable sources, a contract not
checked, a config-gated finding without --model-config) or refused input (checked before anything is
downloaded; no report is written for it). Expected failures are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

from harness.gate.obtain import inputs
from harness.support.paths import REPORTS
from harness.support.report_files import write_atomic

HELP = "pre-upgrade gate: can speculators move to another vLLM? (static reading of the sources)"
EPILOG = (
    "environment: HARNESS_PYPI_URL (the simple index to read vLLM from; default https://pypi.org/simple), "
    "HARNESS_GATE_TIMEOUT (seconds per network operation; default 60), HARNESS_GATE_CACHE (the sources cache; "
    "default .cache/gate)"
)


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "action",
        nargs="?",
        choices=("bisect", "mutants", "pairs"),
        help="bisect: name the first release in which --contract changes (see harness/gate/sweeps/bisect.py); "
        "mutants: run the gate on one-change copies of real releases (harness/gate/sweeps/mutants/); "
        "pairs: run it on every consecutive pair of releases (harness/gate/sweeps/pairs.py)",
    )
    p.add_argument(
        "--releases",
        nargs="+",
        metavar="VERSION",
        default=None,
        help="with mutants: the releases to mutate (default 0.33.0 0.34.0)",
    )
    p.add_argument(
        "--per-operator",
        type=int,
        default=None,
        metavar="N",
        help="with mutants: at most N mutants per operator and release (default 15; --quick: 1)",
    )
    p.add_argument("--quick", action="store_true", help="with mutants: the CI subset (one mutant per operator, 0.34.0)")
    p.add_argument("--contract", help="with bisect: the contract id whose change is looked for")
    p.add_argument(
        "--match",
        metavar="TEXT",
        help="with bisect: only the contract's findings that mention TEXT (e.g. eos_token_id)",
    )
    p.add_argument(
        "--between",
        nargs=2,
        metavar=("A", "B"),
        help="with bisect: the releases to search (default: 0.11.0 and the newest on the index)",
    )
    p.add_argument(
        "--to",
        dest="to_version",
        metavar="BUILD",
        help="the candidate vLLM: a version on the index (0.17, 0.34.0.dev12+gabc1234.cu130), a wheel or "
        "sdist file, a source folder (a git checkout records its commit), or the URL of a wheel or of "
        "an index page (a PEP 503 page, or a folder of vLLM's per-commit wheel index such as "
        "https://wheels.vllm.ai/<commit>/cpu/)",
    )
    p.add_argument(
        "--from",
        default=None,
        dest="from_version",
        metavar="BUILD",
        help="the vLLM speculators runs on now, in any form --to takes (default: the last known good: "
        "fixtures/gate/verified.toml if present, else the newest version whose committed env report "
        "passes; the gate says which)",
    )
    p.add_argument(
        "--lockfile",
        metavar="PATH",
        help="the team's lock file (requirements, pip-compile, pyproject.toml, uv.lock, poetry.lock, pylock): "
        "its vLLM pin is --from and its speculators pin chooses the path judged (>= 0.5: that "
        "release's client over vllm serve; below: the in-process generator)",
    )
    p.add_argument(
        "--base-lockfile",
        metavar="PATH",
        help="in a pull request: the base branch's lock file; --from is its vLLM pin and --to the "
        "--lockfile's (the head's)",
    )
    p.add_argument("--cache-dir", help="where vLLM sources are cached (default: $HARNESS_GATE_CACHE or .cache/gate)")
    p.add_argument("--summary", help="also write the Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--json", help="JSON report path (default: reports/gate-<from>-to-<to>.json)")
    p.add_argument("--allowlist", help="allow-list TOML (default: fixtures/gate/allowlist.toml)")
    p.add_argument(
        "--speculators",
        default=None,
        help="speculators version whose used surface is read (default: the lock file's pin; without one, 0.3.0)",
    )
    p.add_argument(
        "--client",
        metavar="speculators==X.Y.Z",
        help="gate speculators' current path instead (vllm serve + native export + hs-connectors, see "
        "harness/gate/read/client.py): e.g. --client speculators==0.9.0",
    )
    p.add_argument("--surface", help="used-surface fixture (default: fixtures/surfaces/speculators-<version>.json)")
    p.add_argument(
        "--regenerate-surface",
        action="store_true",
        help="rewrite the used-surface fixture from the installed speculators first",
    )
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="decide by running the candidate (a version or a CPU wheel, file or URL): its CPU build installed "
        "into an env of the gate's cache (made once), the suite narrowed to the rows that own what the reading "
        "found (those contracts' probes and shim proofs, the extraction on tiny-llama); minutes, never REVIEW",
    )
    p.add_argument(
        "--use-reports",
        action="store_true",
        help="decide from the candidate's complete report in reports/ (the matrix's run of that build), the same "
        "rows and rule as --dynamic, nothing run",
    )
    p.add_argument(
        "--model-config",
        help="the target checkpoint's config.json: decides config-gated findings "
        "(e.g. llama_4_scaling); without it they count as uncovered",
    )
    p.set_defaults(fn=run)
    return p


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `gate` subcommand to `python -m harness`."""
    return configure(subparsers.add_parser("gate", help=HELP, description=__doc__.splitlines()[0], epilog=EPILOG))


def run(args) -> int:
    """The gate: the request checked once, then obtain -> read -> observe -> decide -> report, each step taking the
    previous one's result (`gate bisect`, `mutants` and `pairs` run that over many builds)."""
    # griffe, the gate's one extra dependency, is imported first: without it, harness.cli names the extra (exit 2)
    from harness.gate.read import reach, static  # noqa: F401

    if args.action in ("bisect", "mutants", "pairs"):
        return _run_sweep(args)
    t0 = time.perf_counter()
    try:
        req = inputs.request(args)
    except inputs.InputRefused as exc:
        print(f"harness gate: {exc}", file=sys.stderr)
        return 2
    if req.client_version:
        return _run_client(req)
    return _pipeline(req, t0)


def _pipeline(req: inputs.Request, t0: float) -> int:
    from harness import contracts
    from harness.gate import observe
    from harness.gate.decide import verdict

    old, new = req.old.label, req.new.label
    meta: dict = {"speculators": req.speculators}
    if req.from_reason:
        print(f"gate: --from not given: {old}, {req.from_reason}", file=sys.stderr)
        meta["from_reason"] = req.from_reason
    try:
        old, new, entries, comparison, paths = _read_both(req, meta, t0)
    except _ReadFailed as failed:
        from harness.envs.sources import BAD_INPUT

        if isinstance(failed.exc, BAD_INPUT):  # the user's input, not a reading the gate could not finish
            print(f"harness gate: {failed.exc}", file=sys.stderr)
            return 2
        gate = verdict.undecided(failed.old, failed.new, str(failed.exc), meta)
        print(f"harness gate: {failed.exc}", file=sys.stderr)
        _write(gate, req, decided=False)
        return gate.exit_code
    if req.checkpoint is not None:
        from harness.gate.read import coverage

        meta["model_config"] = {"file": req.checkpoint["file"], "sha256": req.checkpoint["sha256"]}
        coverage.attach_checkpoint_config(comparison.findings + comparison.carried, req.checkpoint["config"])
    why_not = observe.NOT_REQUESTED if req.observe is None else "see the observation"
    gate = verdict.decide(old, new, comparison, contracts.ids(), entries, _dt.date.today(), None, why_not, paths)
    gate.meta = meta
    if req.observe is not None:
        obs = _observe(req, gate, old)
        verdict.apply_observation(gate, obs)
        meta["timings"]["observe"] = obs.seconds
    meta["timings"]["total"] = round(time.perf_counter() - t0, 2)
    _write(gate, req)
    return gate.exit_code


def _run_sweep(args) -> int:
    """`gate bisect`, `gate mutants`, `gate pairs`: the gate over many builds."""
    if args.action == "bisect":
        if not args.contract:
            print("harness gate bisect: --contract is required", file=sys.stderr)
            return 2
        from harness.gate.sweeps import bisect

        return bisect.run(args)
    if args.action == "mutants":
        return _run_mutants(args)
    from harness.gate.sweeps import pairs

    return pairs.run(args)


class _ReadFailed(Exception):
    """Reading a side failed (sources, surface, allow-list, a tree): the gate is UNDECIDED, with this reason, under
    the sides' labels as far as they were read."""

    def __init__(self, exc: Exception, old: str, new: str):
        super().__init__(str(exc))
        self.exc, self.old, self.new = exc, old, new


def _read_both(req: inputs.Request, meta: dict, t0: float) -> tuple:
    """Both sides obtained and read: (old label, new label, allow-list entries, the static comparison, the watched
    paths' review); the surface, allow-list, provenance and timings go into `meta`."""
    from harness import contracts
    from harness.envs import sources
    from harness.gate.decide import allowlist
    from harness.gate.obtain import artifacts
    from harness.gate.read import coverage, reach, static
    from harness.vllm_source import used_surface

    old_spec, new_spec = req.old, req.new
    old, new = old_spec.label, new_spec.label
    try:
        problems = coverage.validate(contracts.ids())
        if problems:
            raise ValueError("the coverage table is inconsistent: " + "; ".join(problems))
        fixture = req.surface or used_surface.fixture_path(req.speculators)
        if req.regenerate_surface:
            used_surface.generate(fixture)
        used_surface.load(path=fixture)
        meta["surface"] = _display(fixture)
        entries = allowlist.load(req.allowlist)
        meta["allowlist"] = _display(req.allowlist or allowlist.DEFAULT)
        meta["allowlist_entries"] = [e.to_json() for e in entries]
        got = list(reversed([artifacts.fetch(spec, req.cache_dir) for spec in (new_spec, old_spec)]))  # candidate first
        old, new = _side_label(got[0], old_spec.label), _side_label(got[1], new_spec.label)
        meta["sources"] = {side: _provenance(s) for side, s in zip(("from", "to"), got, strict=True)}
        t1 = time.perf_counter()
        old_facts, new_facts = static.read_versions([s.root for s in got], fixture)
        t2 = time.perf_counter()
        comparison = static.compare(old_facts, new_facts)
        paths = reach.review(got[0].root, got[1].root, comparison.findings)
        t3 = time.perf_counter()
    except (
        sources.SourceError,
        static.TreeError,
        allowlist.AllowlistError,
        used_surface.SurfaceUnavailable,
        ValueError,
        OSError,
    ) as exc:
        raise _ReadFailed(exc, old, new) from exc
    meta["timings"] = {"sources": round(t1 - t0, 2), "static": round(t2 - t1, 2), "paths": round(t3 - t2, 2)}
    return old, new, entries, comparison, paths


def _observe(req: inputs.Request, gate, old: str):
    """The candidate observed on the rows that settle the reading: a targeted run (`--dynamic`), or its build's
    complete report (`--use-reports`)."""
    from harness.envs import sources
    from harness.gate import observe

    if req.observe == "reports":
        return observe.from_reports(gate, req.new.label, old)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731 - progress goes to stderr, the report to stdout
    cache = sources.cache_root(req.cache_dir)
    return observe.run(gate, req.new.kind, req.new.label, req.new.location, old, cache, log)


def _run_mutants(args) -> int:
    from harness.envs import sources
    from harness.gate.sweeps import mutants

    releases = args.releases or (["0.34.0"] if args.quick else ["0.33.0", "0.34.0"])
    per = args.per_operator if args.per_operator is not None else (1 if args.quick else 15)
    if per < 1:
        print("harness gate mutants: --per-operator must be at least 1", file=sys.stderr)
        return 2
    stem = "gate-mutants-quick" if args.quick else "gate-mutants"
    out = Path(args.json) if args.json else REPORTS / f"{stem}.json"
    try:
        rep = mutants.run(releases, per, out, out.with_suffix(".md"), log=lambda m: print(m, file=sys.stderr))
    except (sources.SourceError, OSError) as exc:
        print(f"harness gate mutants: {exc}", file=sys.stderr)
        return 2
    print(out.with_suffix(".md").read_text())
    return 0 if not rep["missed"] and not rep["false_alarms"] else 1


def _run_client(req: inputs.Request) -> int:
    from harness.envs import sources
    from harness.gate.obtain import artifacts
    from harness.gate.read import client

    try:
        got = [artifacts.fetch(spec, req.cache_dir) for spec in (req.new, req.old)][::-1]
        old, new = _side_label(got[0], req.old.label), _side_label(got[1], req.new.label)
        version = str(req.client_version)
        rep = client.report(
            version,
            old,
            new,
            client.check(version, got[0].root, got[1].root),
            client.not_judged(got[0].root, got[1].root),
        )
    except (sources.SourceError, OSError, ValueError, SyntaxError) as exc:
        print(f"harness gate: {exc}", file=sys.stderr)
        return 2
    rep["sources"] = {side: _provenance(s) for side, s in zip(("from", "to"), got, strict=True)}
    text = client.markdown(rep)
    print(text)
    if req.summary:
        write_atomic(req.summary, text)
    default = report_path(old, new, rep["sources"]).name.replace("gate-", f"gate-client{version}-", 1)
    write_atomic(req.json or REPORTS / default, json.dumps(rep, indent=2) + "\n")
    return rep["exit_code"]


def _side_label(got, label: str) -> str:
    """A side's name in the report: its version once the sources say it (an index page's newest wheel)."""
    return got.version if got.provenance and got.provenance.get("kind") == "index" else label


def _provenance(got) -> dict:
    where = "<source tree>" if got.origin == "source tree" else "<gate cache>"
    record = {"root": f"{where}/{got.root.name}", **(got.provenance or {"origin": got.origin})}
    return {k: v for k, v in record.items() if v is not None}


def _display(path: Path) -> str:
    from harness.support.paths import REPO_ROOT

    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def report_path(old: str, new: str, sources: dict | None = None) -> Path:
    """`reports/gate-<from>-to-<to>.json`; a side that is not a release from the index carries its kind and a
    short hash (`0.34.0+tree-1a2b3c4d`), so that three source trees that all say 0.34.0 never share a name."""

    def name(label: str, side: str) -> str:
        prov = (sources or {}).get(side) or {}
        if prov.get("kind") in (None, "version"):
            return label
        short = (prov.get("sha256") or prov.get("commit") or "")[:8]
        return f"{label}+{prov['kind']}" + (f"-{short}" if short else "")

    return REPORTS / f"gate-{name(old, 'from')}-to-{name(new, 'to')}.json"


def _write(gate, req: inputs.Request, decided: bool = True) -> None:
    """Markdown on stdout (and --summary), the JSON report to --json or reports/. An undecided run whose sources
    or inputs could not be had (`decided` False) writes the JSON only where --json asks: it never replaces the
    report of an earlier run under reports/, nor leaves one named like a release it could not read."""
    from harness.gate.decide import report as gate_report

    text = gate_report.markdown(gate)
    print(text)
    if req.summary:
        write_atomic(req.summary, text)
    if not req.json and not decided:
        return
    write_atomic(
        req.json or report_path(gate.old, gate.new, gate.meta.get("sources")),
        json.dumps(gate_report.to_json(gate), indent=2, default=str) + "\n",
    )


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m harness.gate ...`) until `python -m harness gate` is wired in."""
    return run(
        configure(argparse.ArgumentParser(prog="python -m harness.gate", description=HELP, epilog=EPILOG)).parse_args(
            argv
        )
    )
