"""Per-env reports: `reports/<env>.json` (schema in the README) and `reports/<env>.md`. Writes are atomic."""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from pathlib import Path

SCHEMA = "harness-env-report/1"


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename, so readers never see half a report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is for everyone who can read the folder
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def build(env: str, meta: dict, contracts: list[dict], e2e: list[dict], tiers: dict, tests: dict,
          stale: list[str], not_observed: list[str], expectations_file: str | None, notes: list[str]) -> dict:
    mismatched = [c["contract"] for c in contracts if c.get("expected") and c["expected"] != c["outcome"]]
    unexpected = [c["contract"] for c in contracts if not c.get("expected")]
    failed = tests.get("failed", 0) + tests.get("error", 0)
    status = "pass" if not (mismatched or unexpected or stale or failed) else "fail"
    return {
        "schema": SCHEMA, "env": env, "generated_at": now(), "status": status,
        "versions": {k: meta.get(k) for k in ("vllm", "vllm_distribution", "speculators", "torch", "transformers", "python")},
        "platform": {k: meta.get(k) for k in ("device_type", "machine", "cpus")},
        "expectations_file": expectations_file,
        "contracts": sorted(contracts, key=lambda c: c["contract"]),
        "mismatched": mismatched, "unexpected": unexpected, "stale_expectations": stale, "not_observed": not_observed,
        "e2e": e2e, "tiers": tiers, "tests": tests, "notes": notes,
    }


def markdown(rep: dict) -> str:
    v, p = rep["versions"], rep["platform"]
    lines = [
        f"# Conformance report: `{rep['env']}` — {rep['status'].upper()}",
        "",
        f"vLLM {v.get('vllm')} ({v.get('vllm_distribution')}), speculators {v.get('speculators')}, torch {v.get('torch')}, "
        f"transformers {v.get('transformers')}, Python {v.get('python')}; platform {p.get('device_type')} "
        f"({p.get('machine')}, {p.get('cpus')} CPUs). Generated {rep['generated_at']}.",
        "",
        "| contract | observed | expected | shim | evidence |",
        "|---|---|---|---|---|",
    ]
    for c in rep["contracts"]:
        mark = "" if c.get("expected") == c["outcome"] else " **MISMATCH**"
        evidence = c["unshimmed"]["error"] if c["unshimmed"] and not c["unshimmed"]["ok"] else c["reason"]
        evidence = (evidence or "").replace("|", "\\|")[:160]
        lines.append(f"| {c['contract']} | {c['outcome']}{mark} | {c.get('expected') or '—'} | "
                     f"{c.get('shim') or ''} | {evidence} |")
    for label, key in (("Stale expectations", "stale_expectations"), ("Not observed", "not_observed"),
                       ("Without expectation", "unexpected")):
        if rep.get(key):
            lines += ["", f"**{label}:** " + ", ".join(rep[key])]
    if rep["e2e"]:
        lines += ["", "## End to end (speculators' generator through the shims)", "",
                  "| model | check | result | measured |", "|---|---|---|---|"]
        for e in rep["e2e"]:
            lines.append(f"| {e['model']} | {e['check']} | {e['result']} | {e.get('measured', '')} |")
    if rep["tiers"]:
        lines += ["", "## Wall time per tier", "", "| tier | tests | passed | failed | skipped | wall s |",
                  "|---|---|---|---|---|---|"]
        for name, t in sorted(rep["tiers"].items()):
            lines.append(f"| {name} | {t['tests']} | {t['passed']} | {t['failed']} | {t['skipped']} | {t['wall_s']:.1f} |")
    if rep["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in rep["notes"]]
    return "\n".join(lines) + "\n"


def write(rep: dict, directory: Path) -> tuple[Path, Path]:
    directory = Path(directory)
    j, m = directory / f"{rep['env']}.json", directory / f"{rep['env']}.md"
    write_atomic(j, json.dumps(rep, indent=2, sort_keys=False, default=str) + "\n")
    write_atomic(m, markdown(rep))
    return j, m
