"""One tracker issue per broken vLLM build, written from the merged matrix and the suites' JUnit XML.

The scheduled matrix goes red when a build fails; a red run nobody opens is forgotten by the next one. The
matrix workflow therefore opens (or, when one with the same title is open, comments on) one issue per failing
build: its title names the build, so each build keeps one thread; its body says what failed (the failing tests
from `reports/<env>.junit.xml`, which `python -m harness run ... -- --junitxml` writes, and the contract rows
that differ from the reviewed expectations) and where the run is. Builds that are incomplete or only observed
are not broken and open nothing.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

#: How many failing tests an issue lists by name (the rest are counted).
SHOWN = 15


def title(column: dict) -> str:
    return f"matrix: vLLM {column['version']} ({column['env']}) fails"


def failing_tests(junit: Path) -> list[str]:
    """'test id: first line of the failure' for each failed or errored test case of a JUnit XML file."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in root.iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None:
            continue
        name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        message = (bad.get("message") or bad.text or "").strip().splitlines()
        out.append(f"{name}: {message[0][:200]}" if message else name)
    return out


def _run_link() -> str:
    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    return f"{server}/{repo}/actions/runs/{run}" if server and repo and run else "this run's artifacts"


def body(column: dict, report_dir: Path) -> str:
    env = column["env"]
    lines = [
        f"The matrix run of vLLM {column['version']} (`{column.get('package', env)}`, env `{env}`) ended "
        f"**{column['status']}**. Reports and logs: {_run_link()} (artifact `report-{env}`).",
        "",
    ]
    tests = column.get("tests") or {}
    if tests:
        lines.append("Tests: " + ", ".join(f"{v} {k}" for k, v in tests.items() if k != "wall_s") + ".")
    failed = failing_tests(report_dir / f"{env}.junit.xml")
    if failed:
        lines += ["", "Failing tests:", *(f"- `{t}`" for t in failed[:SHOWN])]
        if len(failed) > SHOWN:
            lines.append(f"- and {len(failed) - SHOWN} more")
    mismatched = column.get("mismatched") or []
    if mismatched:
        lines += [
            "",
            "Contract rows that differ from the reviewed expectations:",
            *(f"- {m if isinstance(m, str) else json.dumps(m)}" for m in mismatched[:SHOWN]),
        ]
    if not failed and not mismatched:
        lines += ["", "No failing test was recorded (no JUnit XML, or the session itself failed): see the report."]
    lines += [
        "",
        "Opened by the scheduled matrix (`.github/workflows/matrix.yml`); the next failing run comments here.",
    ]
    return "\n".join(lines)


def broken_builds(matrix: dict, report_dir: Path) -> list[dict]:
    """[{"title", "body"}] for each failing column of a merged matrix."""
    return [{"title": title(c), "body": body(c, report_dir)} for c in matrix["columns"] if c["status"] == "fail"]
