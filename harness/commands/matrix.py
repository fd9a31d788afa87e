"""`matrix`, `matrix-envs`, `matrix-issues`, `tox-envs`: the matrix of vLLM builds, merged from the env reports,
and the envs it is made of."""

from __future__ import annotations

import json
from pathlib import Path

from harness.commands import refuse
from harness.support.cli_text import INCOMPLETE
from harness.support.paths import CHECKOUT, REPO_ROOT, REPORTS


def cmd_matrix(args) -> int:
    """Merge reports/vllm*.json into reports/matrix.{json,md,html}."""
    from harness.reporting import client_axis, matrix_page

    folder = Path(args.report_dir)
    if not folder.is_dir() or not any(folder.glob("vllm*.json")):
        return refuse(f"matrix: {folder} holds no env reports (vllm*.json): nothing to merge, nothing written")
    m = matrix_page.write(folder)
    if CHECKOUT and folder.resolve() == REPORTS.resolve():  # the committed matrix: the README's answer follows
        client_axis.rewrite_readme(REPO_ROOT / "README.md", m)
    bad = [c["version"] for c in m["columns"] if c["status"] == "fail"]
    partial = [c["version"] for c in m["columns"] if c["status"] == "incomplete"]
    print(
        f"harness: matrix of {len(m['rows'])} rows x {len(m['columns'])} versions written to {args.report_dir}"
        + (f"; failing: {', '.join(bad)}" if bad else "")
        + (f"; incomplete: {', '.join(partial)}" if partial else "")
    )
    return 1 if bad else INCOMPLETE if partial else 0


def cmd_matrix_envs(args) -> int:
    """The matrix envs as one JSON list (CI fans out over it: .github/workflows/matrix.yml)."""
    from harness.envs import tox_envs

    print(json.dumps(tox_envs.env_names()))
    return 0


def cmd_matrix_issues(args) -> int:
    """One issue (title, body) per failing build of reports/matrix.json, as JSON: the scheduled matrix files them."""
    from harness.reporting import issues

    path = Path(args.report_dir) / "matrix.json"
    try:
        matrix = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return refuse(f"matrix-issues: {path} is not a merged matrix ({e}); run `python -m harness matrix` first")
    print(json.dumps(issues.broken_builds(matrix, Path(args.report_dir)), indent=1))
    return 0


def cmd_tox_envs(args) -> int:
    from harness.envs import tox_envs
    from harness.support.report_files import write_atomic

    if not args.write:
        print(tox_envs.tox_section(), end="")
        return 0
    path = REPO_ROOT / "tox.ini"
    if not CHECKOUT:
        return refuse("tox-envs --write rewrites a checkout's tox.ini; this harness is installed")
    try:
        rendered = tox_envs.render_tox_ini(path.read_text())
    except ValueError as e:
        return refuse(f"{path}: {e}")
    changed = rendered != path.read_text()
    if changed:
        write_atomic(path, rendered)
    print(f"harness: {path} {'rewritten' if changed else 'already up to date'}: envs {', '.join(tox_envs.env_names())}")
    return 0


def add_matrix(sub) -> None:
    """`matrix`."""
    m = sub.add_parser("matrix", help="merge reports/vllm*.json into reports/matrix.{json,md,html}")
    m.add_argument(
        "--report-dir",
        default=str(REPORTS),
        help="the folder holding the env reports (vllm*.json); the matrix is written there",
    )
    m.set_defaults(fn=cmd_matrix)


def add_matrix_envs(sub) -> None:
    """`matrix-envs`."""
    sub.add_parser("matrix-envs", help="print the matrix envs as a JSON list (for CI fan-out)").set_defaults(
        fn=cmd_matrix_envs
    )


def add_matrix_issues(sub) -> None:
    """`matrix-issues`."""
    i = sub.add_parser("matrix-issues", help="print one issue (title, body) per failing build of matrix.json, as JSON")
    i.add_argument("--report-dir", default=str(REPORTS), help="the folder holding matrix.json and <env>.junit.xml")
    i.set_defaults(fn=cmd_matrix_issues)


def add_tox_envs(sub) -> None:
    """`tox-envs`."""
    t = sub.add_parser("tox-envs", help="print tox.ini's matrix section, rendered from fixtures/envs/matrix.toml")
    t.add_argument("--write", action="store_true", help="write it (and the `matrix` label) into tox.ini")
    t.set_defaults(fn=cmd_tox_envs)
