"""`python -m harness gate bisect --contract ID [--between A B]`: which release changed a contract?

The static gate compares two versions; a team that finds a contract broken on a new vLLM next asks where it
broke. This walks the releases the index serves between A (default: the version speculators 0.3.0 was
written for) and B (default: the newest release), reads each probed release's sources as the gate does
(cached; about 10 s a version the first time), and bisects for the first release in which the contract has a
finding relative to A (`--match TEXT`: only findings that mention TEXT, e.g. one keyword of a contract that
changed more than once). The neighbours are both read, so the answer is a pair: "absent in X, present in Y",
with the finding's evidence lines from Y's sources. Bisection assumes a change, once made, stays; where B shows
no finding, that assumption says nothing, so every release between A and B is read in order instead: a change
made and later undone is named with the release that undid it, never reported as "no finding". Per-commit
builds are not bisected: vLLM's wheel index lists commits without their order.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from harness.envs import sources
from harness.gate.obtain.baseline import WRITTEN_FOR


@dataclass
class Bisection:
    contract: str
    between: tuple[str, str]
    releases: list[str]
    probed: dict[str, int] = field(default_factory=dict)  # version -> findings of the contract vs A
    first: str | None = None  # the first release with a finding
    last_without: str | None = None
    undone_in: str | None = None  # the first later release without it, where B has none
    evidence: list[dict] = field(default_factory=list)

    def says(self) -> str:
        a, b = self.between
        if self.first is None:
            return f"{self.contract}: no finding between {a} and {b} ({len(self.probed)} releases read)"
        undone = f"; undone again in {self.undone_in}" if self.undone_in else ""
        return (
            f"{self.contract}: first changed in {self.first} (no finding in {self.last_without}{undone}; "
            f"{len(self.probed)} of {len(self.releases)} releases read)"
        )


def releases_between(a: str, b: str) -> list[str]:
    """Every final release the index lists with a <= version <= b, in order."""
    lo, hi = Version(a), Version(b)
    found = {sources.file_version(f) for f in sources.list_files()}
    return [str(v) for v in sorted(v for v in found if v is not None and not v.is_prerelease and lo <= v <= hi)]


def _matches(finding, text: str | None) -> bool:
    """A finding of interest: all of the contract's, or those that mention `text` (a keyword, a helper name)."""
    if not text:
        return True
    return any(text in str(x) for x in (finding.symbol, finding.kind, finding.old, finding.new, finding.detail))


def locate(releases: list[str], changed) -> tuple[str | None, str | None, str | None]:
    """(first release where `changed(release)`, the one before it, the first later one where it is undone) over
    `releases`, whose first has no change by definition (it is A). Bisects when the last release has the change;
    reads every release in order when it has not (a change made and undone), each at most once."""
    lo, hi = 0, len(releases) - 1
    if hi <= 0:
        return None, None, None
    if not changed(releases[hi]):
        hit = next((i for i in range(1, hi) if changed(releases[i])), None)
        if hit is None:
            return None, None, None
        undone = next(releases[i] for i in range(hit + 1, hi + 1) if not changed(releases[i]))
        return releases[hit], releases[hit - 1], undone
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if changed(releases[mid]):
            hi = mid
        else:
            lo = mid
    return releases[hi], releases[lo], None


def bisect(
    contract: str,
    a: str | None = None,
    b: str | None = None,
    cache_dir=None,
    fixture: Path | None = None,
    log=print,
    match: str | None = None,
) -> Bisection:
    from harness.gate.read import static
    from harness.vllm_source import used_surface

    fixture = fixture or used_surface.fixture_path("0.3.0")
    a = sources.normalize(a or WRITTEN_FOR)
    b = sources.normalize(b) if b else None  # refuses what is not a version, before the index is read
    listed = releases_between(a, b or "9999")
    b = sources.normalize(b) if b else listed[-1]
    releases = [v for v in listed if Version(v) <= Version(b)]
    if a not in releases or b not in releases:
        raise sources.VersionNotFound(f"{a if a not in releases else b} is not a release on the index")
    out = Bisection(contract, (a, b), releases)
    base = static.read_versions([sources.ensure(a, cache_dir).root], fixture)[0]
    findings_at: dict[str, list] = {}

    def findings(version: str) -> list:
        if version not in findings_at:
            root = sources.ensure(version, cache_dir).root
            facts = static.read_versions([root], fixture)[0]
            found = [f for f in static.compare(base, facts).findings if f.contract == contract and _matches(f, match)]
            findings_at[version] = found
            out.probed[version] = len(found)
            log(f"gate bisect: {version}: {len(found)} finding(s) for {contract}")
        return findings_at[version]

    out.first, out.last_without, out.undone_in = locate(releases, lambda v: bool(findings(v)))
    if out.first is None:
        return out
    root = sources.ensure(out.first, cache_dir).root
    for f in findings(out.first):
        line = _line(root, f.evidence)
        out.evidence.append(
            {"symbol": f.symbol, "kind": f.kind, "old": f.old, "new": f.new, "evidence": f.evidence, "line": line}
        )
    return out


def _line(root: Path, evidence: str | None) -> str | None:
    if not evidence or ":" not in evidence:
        return None
    path, _, number = evidence.rpartition(":")
    try:
        return (Path(root) / path).read_text().splitlines()[int(number) - 1].strip()
    except (OSError, ValueError, IndexError):
        return None


def run(args) -> int:
    """The `gate bisect` command: 0 when a first release is named, 1 when the contract never changes in the range,
    2 when it cannot decide (unknown contract or version, no network)."""
    from harness import contracts

    if args.contract not in contracts.ids():
        print(
            f"harness gate bisect: unknown contract {args.contract!r} (one of: {', '.join(contracts.ids())})",
            file=sys.stderr,
        )
        return 2
    a, b = args.between or (None, None)
    try:
        result = bisect(args.contract, a, b, args.cache_dir, log=lambda m: print(m, file=sys.stderr), match=args.match)
    except sources.SourceError as exc:
        print(f"harness gate bisect: {exc}", file=sys.stderr)
        return 2
    print(result.says())
    for e in result.evidence:
        print(f"  {e['kind']}: {e['symbol']}: {e['old']} -> {e['new']}  [{e['evidence']}] {e['line'] or ''}")
    return 0 if result.first else 1
