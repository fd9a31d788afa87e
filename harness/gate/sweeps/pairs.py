"""`harness gate pairs`: the gate on every consecutive pair of vLLM releases, one table.

What a reviewer meets when a team moves one release at a time: per pair, the verdict and how many changes on a
watched path no check classifies (`changed-unclassified`, `harness.gate.read.reach`), next to the classified findings.
A pair with hundreds of them would mean a watched path is drawn too wide; the counts are the evidence for where the
paths stop. Writes `reports/gate-release-pairs.{json,md}` (or `--json`).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.version import Version

from harness.support.paths import REPORTS

FIRST, LAST = "0.11.0", "0.34.0"


def releases(first: str, last: str) -> list[str]:
    """Final releases on the index from `first` to `last` (post-releases left out: they repeat their release)."""
    from harness.envs import sources

    found = set()
    for a in sources.list_files():
        v = sources.file_version(a)
        if v is None or v.is_prerelease or v.is_devrelease or v.is_postrelease or v.local:
            continue
        if Version(first) <= v <= Version(last):
            found.add(v)
    return [str(v) for v in sorted(found)]


def decidable(version: str) -> bool:
    """Whether the candidate has a CPU build here that a dynamic decision can run (an env of the matrix)."""
    from harness.envs import tox_envs

    meta = tox_envs.versions().get(version)
    return bool(meta and meta.get("runnable", True))


def _gate(old: str, new: str, out: Path, args, dynamic: bool) -> tuple[int, dict, float]:
    """One pair judged by the `harness gate` command in a process of its own: (exit code, report, seconds)."""
    t0 = time.perf_counter()
    rc = subprocess.run(
        [sys.executable, "-m", "harness", "gate", "--from", old, "--to", new, "--json", str(out)]
        + (["--cache-dir", args.cache_dir] if args.cache_dir else [])
        + (["--dynamic"] if dynamic else []),
        stdout=subprocess.DEVNULL,
        check=False,
    ).returncode
    return rc, (json.loads(out.read_text()) if out.exists() else {}), round(time.perf_counter() - t0, 1)


def _dynamic_cell(rep: dict, seconds: float) -> dict:
    obs = rep.get("observation") or {}
    return {
        "verdict": rep.get("verdict", "UNDECIDED"),
        "observed_verdict": obs.get("verdict"),
        "seconds": seconds,
        "source": obs.get("source"),
        "rows": [r["row"] for r in obs.get("rows", [])],
        "observed": {r["row"]: r["outcome"] for r in obs.get("rows", [])},
        "error": obs.get("error") or rep.get("error"),
        "timings": obs.get("timings", {}),
    }


def run(args) -> int:
    """Each pair is judged by the `harness gate` command itself, in a process of its own; with --dynamic, each pair
    whose candidate has a CPU build here is also decided by a targeted run of it, merged into the existing report
    (the other pairs' rows are kept)."""
    from harness.envs import sources
    from harness.support.report_files import now, write_atomic

    first, last = args.between or (FIRST, LAST)
    try:
        versions = releases(first, last)
    except sources.SourceError as exc:
        print(f"harness gate pairs: {exc}", file=sys.stderr)
        return 2
    target = Path(args.json) if args.json else REPORTS / "gate-release-pairs.json"
    previous = json.loads(target.read_text()) if target.is_file() else {}
    kept = {(r["from"], r["to"]): r for r in previous.get("pairs", [])}
    rows = []
    with tempfile.TemporaryDirectory(prefix="harness-gate-pairs-") as tmp:
        for old, new in itertools.pairwise(versions):
            out = Path(tmp) / f"{old}-{new}.json"
            rc, rep, seconds = _gate(old, new, out, args, dynamic=False)
            by_contract: dict[str, int] = {}
            for c in rep.get("unclassified", []):
                by_contract[c["contract"]] = by_contract.get(c["contract"], 0) + 1
            rows.append(
                {
                    "from": old,
                    "to": new,
                    "verdict": rep.get("verdict", "UNDECIDED"),
                    "exit_code": rc,
                    "findings": len(rep.get("findings", [])),
                    "uncovered": sum(f["status"] == "uncovered" for f in rep.get("findings", [])),
                    "changed_unclassified": len(rep.get("unclassified", [])),
                    "classified": len(rep.get("classified", [])),
                    "unclassified_by_contract": by_contract,
                    "error": rep.get("error"),
                    "seconds": seconds,
                    "dynamic": (kept.get((old, new)) or {}).get("dynamic"),
                }
            )
            if args.dynamic and decidable(new):
                rc, rep, seconds = _gate(old, new, Path(tmp) / f"{old}-{new}-dynamic.json", args, dynamic=True)
                rows[-1]["dynamic"] = _dynamic_cell(rep, seconds)
            print(
                f"gate pairs: {old} -> {new}: {rows[-1]['verdict']}, {rows[-1]['changed_unclassified']} "
                f"changed-unclassified"
                + (f"; decided {rows[-1]['dynamic']['verdict']}" if rows[-1].get("dynamic") else ""),
                file=sys.stderr,
            )
    done = {(r["from"], r["to"]) for r in rows}
    rows += [r for key, r in kept.items() if key not in done]
    rows.sort(key=lambda r: (Version(r["from"]), Version(r["to"])))
    every = sorted({v for r in rows for v in (r["from"], r["to"])}, key=Version)
    report = {"schema": "harness-gate-pairs/2", "generated_at": now(), "releases": every, "pairs": rows}
    write_atomic(target, json.dumps(report, indent=2) + "\n")
    write_atomic(target.with_suffix(".md"), markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    lines = [
        "# The gate on consecutive vLLM releases",
        "",
        "speculators 0.3.0's surface; static reading plus the watched paths. `findings`: changes the targeted "
        "checks name (`uncovered`: no shim covers them); `changed-unclassified`: functions on a watched path "
        "that changed with no check classifying the change (a reviewer reads them, or `--dynamic` observes "
        "the contract); `classified`: changed functions a finding already accounts for.",
        "",
        "`decided`: the verdict of `--dynamic` (a targeted run of the candidate's CPU build on the rows that own "
        "what the reading found) and its wall time on the 2-core machine; blank where the candidate has no CPU "
        "build here or the sweep did not run it.",
        "",
        "| from | to | verdict | decided (time) | findings (uncovered) | changed-unclassified | by contract "
        "| classified |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["pairs"]:
        by = ", ".join(f"{k} {v}" for k, v in sorted(r["unclassified_by_contract"].items()))
        d = r.get("dynamic")
        decided = f"{d['verdict']} ({d['seconds'] / 60:.1f} min)" if d else ""
        lines.append(
            f"| {r['from']} | {r['to']} | {r['verdict']} | {decided} | {r['findings']} ({r['uncovered']}) | "
            f"{r['changed_unclassified']} | {by} | {r['classified']} |"
        )
    return "\n".join(lines) + "\n"
