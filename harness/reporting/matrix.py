"""The merge of the env reports into the matrix (`merge`), and its Markdown (the page: matrix_page).

`merge()` reads every `reports/vllm*.json` a run left. A version whose env did not produce a report is shown as
"not runnable here" with the reason from matrix.toml or the missing report — never as passed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.envs.tox_envs import versions
from harness.reporting import builds, client_axis
from harness.reporting.report import PROOF_NEEDED, PROOF_NOT_RUN, SUBSET, judge, read
from harness.support.paths import REPORTS

SCHEMA = "harness-matrix/1"


def merge(report_dir: Path = REPORTS) -> dict:
    report_dir = Path(report_dir)
    columns: list[dict] = []
    rows: dict[str, dict] = {}
    clients: dict[str, dict] = {v: {} for v in client_axis.CLIENTS}
    cuda = builds.cuda_cells(report_dir, client_axis._cell)
    for ver, meta in versions().items():
        path = report_dir / f"{meta['env']}.json"
        col = {"version": ver, "env": meta["env"], "package": meta["package"]}
        unrunnable = _unrunnable(meta, path)
        if unrunnable:
            col.update(status="not runnable here", reason=unrunnable)
            for v, cell in client_axis.not_runnable(unrunnable).items():
                clients[v][ver] = cell
        else:
            rep, status, gaps, supplement, evidence = _judged(path, report_dir, meta["env"])
            for v, cell in client_axis.cells(rep, status, evidence).items():
                clients[v][ver] = cell
            col.update(_column(rep, status, gaps, supplement))
            col["tensor_parallel"] = tensor_parallel(report_dir, meta["env"])
            _contract_cells(rows, ver, rep)
            _e2e_cells(rows, ver, rep, status)
            _label_cpu_build_faults(rows, ver, rep)
        columns.append(col)
    for v, row in clients.items():
        for col in columns:
            row[col["version"]] = client_axis.shown(row.get(col["version"]), cuda.get(v, {}).get(col["version"]))
    _fill_unobserved(rows, columns)
    walls = {
        c["version"]: c["wall_s"] + (c.get("benchmark") or {}).get("wall_s", 0)
        for c in columns
        if c.get("wall_s") is not None
    }
    slowest = max(walls, key=lambda v: walls[v]) if walls else None
    return {
        "schema": SCHEMA,
        "columns": columns,
        "rows": dict(sorted(rows.items(), key=_row_order)),
        "clients": clients,
        # The envs' own session times (tests; benchmark where it recorded its time): what the matrix costs
        # run one env after another on the machine that wrote the reports.
        "wall_s_total": round(sum(walls.values()), 1) if walls else None,
        # Fanned out, one runner per env (.github/workflows/matrix.yml), the matrix takes as long as its slowest
        # env: derived from the same per-env times, not measured as a fan-out run.
        "wall_s_fanned_out": round(walls[slowest], 1) if walls else None,
        "slowest_env": slowest,
        "proofs_s_total": round(sum(c.get("proofs_s") or 0 for c in columns), 1),
    }


_TP_ROW = re.compile(r"^TP=(\d+):")


def tensor_parallel(report_dir: Path, env: str) -> dict[str, str]:
    """TP size -> "pass" or "fail", from the TP rows of every report of this build: its run, its supplement and
    its TP runs (`harness run --tp N`: <env>-tp<N>.json). A size with any failed row is "fail"."""
    paths = [report_dir / f"{env}.json", report_dir / f"{env}.incomplete.json"]
    paths += sorted(report_dir.glob(f"{env}-tp*.json"))
    sizes: dict[str, str] = {}
    for path in paths:
        if not path.is_file():
            continue
        for row in json.loads(path.read_text()).get("e2e", []):
            found = _TP_ROW.match(row.get("check", ""))
            if found and row.get("result") in ("pass", "fail"):
                size = found.group(1)
                sizes[size] = "fail" if "fail" in (sizes.get(size), row["result"]) else "pass"
    return dict(sorted(sizes.items(), key=lambda kv: int(kv[0])))


def _unrunnable(meta: dict, path: Path) -> str | None:
    """Why a version's column is "not runnable here" (matrix.toml says so, or its env left no report), or None."""
    if not meta.get("runnable", True):
        return meta.get("reason") or "see fixtures/envs/matrix.toml"
    if not path.is_file():
        return f"no report: reports/{path.name} was not produced (run `tox -e {meta['env']}`)"
    return None


def _judged(path: Path, report_dir: Path, env: str) -> tuple[dict, str, list, dict | None, str]:
    """The env's report (with its benchmark), judged again by the current rule from its own content (a report
    written under an older, greener rule does not keep its old verdict), a subset run's supplement folded in; and
    the evidence its cells cite."""
    rep = read(path)
    bench = report_dir / f"{env}.bench.json"
    if bench.is_file():
        rep["benchmark"] = json.loads(bench.read_text())
    status, gaps = judge(rep)
    supplement = fold_supplement(rep, report_dir / f"{env}.incomplete.json")
    status, gaps = _predates(rep, status, gaps)  # after the supplement: the rows it observed are not missing
    if supplement and supplement["status"] != "pass" and status != "fail":
        status = supplement["status"]
        gaps = gaps + [dict(g, what="subset run: " + g["what"]) for g in supplement["gaps"]]
    evidence = f"reports/{path.name}" + (f" + reports/{env}.incomplete.json" if supplement else "")
    return rep, status, gaps, supplement, evidence


def _column(rep: dict, status: str, gaps: list, supplement: dict | None) -> dict:
    return {
        "status": status,
        "incomplete": gaps,
        "installed": rep["versions"],
        "generated_at": rep["generated_at"],
        "wall_s": rep["tests"].get("wall_s"),
        "proofs_s": (rep.get("timings") or {}).get("proofs_s"),
        "tiers": rep["tiers"],
        "tests": rep["tests"],
        "notes": rep.get("notes", []),
        "benchmark": rep.get("benchmark"),
        "stale": rep.get("stale_expectations", []),
        "mismatched": rep.get("mismatched", []),
        "supplement": supplement,
    }


def _contract_cells(rows: dict, ver: str, rep: dict) -> None:
    for c in rep["contracts"]:
        rows.setdefault(c["contract"], {})[ver] = {
            "outcome": c["outcome"],
            "expected": c.get("expected"),
            "shim": c.get("shim"),
            "reason": c.get("reason"),
            "error": (c.get("unshimmed") or {}).get("error"),
            "proof": c.get("proof") or {"result": PROOF_NOT_RUN, "evidence": "the report records no proof"},
            **({"run": c["run"]} if c.get("run") else {}),
        }


def _e2e_cells(rows: dict, ver: str, rep: dict, status: str) -> None:
    """One row per model, e2e[<model>], from its numeric checks."""
    by_model: dict[str, list] = {}
    for e in rep.get("e2e", []):
        if not e["model"].startswith("native:"):  # the native cross-check has its own row, native[<model>]
            by_model.setdefault(e["model"], []).append(e)
    for model, checks in by_model.items():
        outcome = _e2e_outcome(checks, status)
        rows.setdefault(f"e2e[{model}]", {})[ver] = {
            "outcome": outcome,
            "expected": "broken" if outcome == "broken" else None,
            "shim": None,
            "reason": "; ".join(f"{e['check']}: {e['measured']}" for e in checks),
            "error": None,
            **({"run": checks[0]["run"]} if checks[0].get("run") else {}),
        }


def _e2e_outcome(checks: list[dict], status: str) -> str:
    # A check that does not apply here says nothing; a measurement is not a check.
    results = {e["result"] for e in checks} - {"n/a", "measured"}
    if not results:
        return "n/a"
    if results <= {"pass"}:
        return "pass"
    # A failing numeric check in a run that did not fail was expected to fail (e2e[model] = broken).
    return "broken" if status in ("pass", "incomplete") else "fail"


def _fill_unobserved(rows: dict, columns: list[dict]) -> None:
    """Every row gets a cell in every column: "not runnable here" or "not observed" where the report had none."""
    for cells in rows.values():
        for col in columns:
            if col["version"] not in cells:
                cells[col["version"]] = {
                    "outcome": "not runnable here" if col["status"] == "not runnable here" else "not observed",
                    "reason": col.get("reason", ""),
                }


NOT_ON_CPU = "not on the CPU build"


def _label_cpu_build_faults(rows: dict, ver: str, rep: dict) -> None:
    """A row its expectations file attributes to vLLM's CPU build (`fault = "cpu-build"`: the CPU runner cannot run
    that path, CUDA may) is shown "not on the CPU build", never "broken": the matrix's rows are CPU observations."""
    from harness.reporting import expectations

    path = expectations.file_for(rep["versions"].get("vllm", ""), (rep.get("platform") or {}).get("device_type", ""))
    if (rep.get("platform") or {}).get("device_type") != "cpu" or not path.is_file():
        return
    for key, exp in expectations.load_file(path, facts={}).items():
        cell = rows.get(key, {}).get(ver)
        if exp.fault == "cpu-build" and cell and cell["outcome"] == "broken":
            cell.update(outcome=NOT_ON_CPU, expected=NOT_ON_CPU, observed="broken", fault="vLLM's CPU build")


def fold_supplement(rep: dict, path: Path) -> dict | None:
    """A deliberate subset run of the same build, newer than its complete report (`harness run --suite X` after
    that suite gained rows; it is written to <env>.incomplete.json beside the complete report): the rows it
    observed that the complete report lacks are added to `rep`, each marked with its run; a failing subset fails
    the column. A row the complete report observed is never replaced, and an interrupted or stopped subset, one of
    another vLLM, or one older than the complete report adds nothing."""
    sub = _usable_subset(rep, path)
    if sub is None:
        return None
    sel = sub.get("selection") or {}
    have = {c["contract"] for c in rep["contracts"]}
    # Left out on purpose: that is what a subset is; so are the rows the complete report observed.
    status, gaps = judge(dict(sub, not_observed=[k for k in sub.get("not_observed") or [] if k not in have]))
    gaps = [g for g in gaps if g["kind"] != SUBSET]
    cpu = (sub.get("platform") or {}).get("cpu") or "a machine it did not record"
    run = f"subset run {sub['generated_at']} on {cpu}"  # each added row's provenance: which run, which machine
    added = [dict(c, run=run) for c in sub["contracts"] if c["contract"] not in have]
    models = {e["model"] for e in rep.get("e2e", [])}
    added_e2e = [dict(e, run=run) for e in sub.get("e2e", []) if e["model"] not in models]
    rep["contracts"] = rep["contracts"] + added
    rep["e2e"] = rep.get("e2e", []) + added_e2e
    return {
        "generated_at": sub["generated_at"],
        "status": "fail" if status == "fail" else "incomplete" if gaps else "pass",
        "gaps": gaps,
        "selected": sel.get("subset", []),
        "tests": sub.get("tests", {}),
        "rows_added": sorted({c["contract"] for c in added} | {f"e2e[{e['model']}]" for e in added_e2e}),
    }


def _usable_subset(rep: dict, path: Path) -> dict | None:
    """The subset report at `path` where it may add rows to `rep`: of the same vLLM, newer, run to its end."""
    if not path.is_file():
        return None
    sub = read(path)
    sel = sub.get("selection") or {}
    if (
        sub.get("interrupted")
        or sel.get("stopped_early")
        or sub["versions"].get("vllm") != rep["versions"].get("vllm")
        or sub["generated_at"] <= rep["generated_at"]
    ):
        return None
    return sub


def _predates(rep: dict, status: str, gaps: list) -> tuple[str, list]:
    """A report written before the suite had some of its rows (a tiny-model fixture added since) did not observe
    them: never `pass` for what it did not run."""
    from harness import contracts

    if "contracts" not in (rep.get("tiers") or {}):
        return status, gaps
    missing = sorted(set(contracts.keys()) - {c["contract"] for c in rep.get("contracts", [])})
    if not missing:
        return status, gaps
    gaps = gaps + [
        {
            "kind": "not observed",
            "what": "rows the suite has gained since this report was written: " + ", ".join(missing),
            "action": f"observe them alone: HARNESS_RUN_ARGS=--complete tox -e {rep.get('env')}",
        }
    ]
    return ("incomplete" if status == "pass" else status), gaps


def shimmed_on(m: dict, contract_id: str) -> str:
    """Where the matrix observed any row of `contract_id` shimmed, as version ranges over its columns
    ("0.11.1–0.32.0"; "—" if nowhere). The README's contract table carries this text (a unit test checks it)."""
    versions = [c["version"] for c in m["columns"]]
    rows = [cells for key, cells in m["rows"].items() if key.split("[")[0] == contract_id]
    hit = [any(cells[v]["outcome"] == "shimmed" for cells in rows) for v in versions]
    runs, start = [], None
    for i, on in enumerate(hit + [False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append(versions[start] if start == i - 1 else f"{versions[start]}–{versions[i - 1]}")
            start = None
    return ", ".join(runs) or "—"


def _row_order(item):
    key = item[0]
    return (key.startswith("e2e["), key)


def bench_cell(b: dict | None) -> str:
    """A benchmark as a cell: the paired median ratio and its min-max, or a single measurement marked so."""
    if not b:
        return "—"
    if isinstance(b.get("ratio"), dict):
        r = b["ratio"]
        return f"{r['median']:.2f} ({r['min']:.2f}–{r['max']:.2f})"
    return f"{b['ratio']:.2f} (single, unpaired)"


def to_markdown(m: dict) -> str:
    cols = m["columns"]
    head = "| contract | " + " | ".join(c["version"] for c in cols) + " |"
    lines = [
        "# speculators 0.3.0 × vLLM: compatibility matrix",
        "",
        "Cells: **native** (speculators' own call works), **shimmed** (fails as documented; our shim restores it),",
        "**broken** (no shim restores it), n/a, not on the CPU build (vLLM's CPU build cannot run the path: its "
        "error is the fault), or not runnable here. Observed on each real vLLM CPU build.",
        "Rows `native*` are vLLM's own hidden-state export (0.17+), not speculators' calls: **native** = it holds "
        "(`native[model]`: runs here and agrees with ours), **broken** = it does not hold here (the cell says why).",
        "",
        *(client_axis.to_markdown(m) if m.get("clients") else []),
        "",
        "## Contract rows (speculators 0.3.0) and end-to-end checks",
        "",
        head,
        "|---|" + "---|" * len(cols),
        "| **status** | "
        + " | ".join(f"**{c['status']}**" if c["status"] != "incomplete" else "*incomplete*" for c in cols)
        + " |",
    ]
    for key, cells in m["rows"].items():
        lines.append(f"| {key} | " + " | ".join(short_cell(cells[c["version"]]) for c in cols) + " |")
    lines += ["| wall s | " + " | ".join(str(c.get("wall_s", "—")) for c in cols) + " |"]
    bench = [c for c in cols if c.get("benchmark")]
    if bench:
        lines.append("| extraction / prefill | " + " | ".join(bench_cell(c.get("benchmark")) for c in cols) + " |")
    return "\n".join(lines + _wall_time_line(m) + _footnotes(m)) + "\n"


def _footnotes(m: dict) -> list[str]:
    """The proof mark's meaning where a cell carries it; why a column is incomplete or not runnable here."""
    cols, lines = m["columns"], []
    if any(PROOF_MARK in short_cell(cell) for cells in m["rows"].values() for cell in cells.values()):
        lines += ["", f"{PROOF_MARK} shimmed, but the run did not prove the shim needed and sufficient."]
    partial = [c for c in cols if c["status"] == "incomplete"]
    if partial:
        lines += ["", "Incomplete (nothing failed, but not everything was observed):"]
        lines += [
            f"- {c['version']}: "
            + "; ".join(g["what"] + (f" ({g['action']})" if g.get("action") else "") for g in c["incomplete"])
            for c in partial
        ]
    missing = [c for c in cols if c["status"] == "not runnable here"]
    if missing:
        lines += ["", "Not runnable here:"] + [f"- {c['version']}: {c['reason']}" for c in missing]
    return lines


def _wall_time_line(m: dict) -> list[str]:
    """What the matrix costs, one env after another and fanned out (derived from the envs' own times)."""
    if not m.get("wall_s_total"):
        return []
    proofs = f", shim proofs {m['proofs_s_total'] / 60:.0f} min of it" if m.get("proofs_s_total") else ""
    fanned = (
        f"; fanned out one env per runner (.github/workflows/matrix.yml) it takes as long as the slowest "
        f"env, {m['slowest_env']}: {m['wall_s_fanned_out'] / 60:.0f} min (derived from the same times)"
        if m.get("wall_s_fanned_out")
        else ""
    )
    return [
        "",
        f"Matrix wall time: {m['wall_s_total'] / 60:.0f} min (the envs' sessions and benchmarks, one "
        "after another; tox's install time not included)" + proofs + fanned + ".",
    ]


PROOF_MARK = "†"


def short_cell(cell: dict, markdown: bool = True) -> str:
    o = cell["outcome"]
    mark = "" if cell.get("expected") in (None, o) else " ≠exp"
    if o == "shimmed" and (cell.get("proof") or {}).get("result") != PROOF_NEEDED:
        mark += PROOF_MARK
    return ("**broken**" if o == "broken" and markdown else o) + mark
