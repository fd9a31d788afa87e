"""The matrix as one HTML page (a verdict per version, the legend, every cell with its evidence one click away,
filterable by model), and `write()`: reports/matrix.{json,md,html} from the env reports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.reporting.matrix import PROOF_MARK, bench_cell, merge, short_cell, to_markdown
from harness.support.paths import REPORTS

#: Okabe-Ito tints, safe for the common colour-vision deficiencies: blue = works, yellow = works through shims,
#: orange = broken, greys = does not apply / not runnable; "not observed" is white with a dashed border, so it
#: never looks like broken. Every cell also says its verdict in a glyph and a word.
OK, SHIM, PART, BAD, NA, NOPE, UNSEEN, SEEN = (
    "#cde7f7",
    "#fbeebf",
    "#f9d8a8",
    "#e69f00",
    "#f2f2f2",
    "#e4e4e4",
    "#ffffff",
    "#dcd3f0",
)
COLORS = {
    "native": OK,
    "shimmed": SHIM,
    "broken": BAD,
    "n/a": NA,
    "pass": OK,
    "fail": BAD,
    "not runnable here": NOPE,
    "not on the CPU build": NOPE,
    "not observed": UNSEEN,
    "incomplete": UNSEEN,
    "observed": SEEN,
}
LEGEND = (
    ("native", "speculators' own call works"),
    ("shimmed", "it fails as documented; the harness's shim restores it"),
    ("broken", "no shim restores it (the cell says whose fault)"),
    ("pass", "end to end: equal to transformers"),
    ("n/a", "does not apply to this model or version"),
    ("not on the CPU build", "vLLM's CPU build cannot run this path (its error is the fault; CUDA may)"),
    ("not observed", "the run did not observe it"),
    ("incomplete", "nothing failed, but not everything was observed"),
)


def verdicts(m: dict) -> dict[str, str]:
    """Per version, one line a team reads first: for which models extraction works, through which shims, or
    why not."""
    out = {}
    for c in m["columns"]:
        ver = c["version"]
        if c["status"] == "not runnable here":
            out[ver] = f"not runnable here: {c.get('reason', '')}"
            continue
        e2e = {k[4:-1]: cells[ver] for k, cells in m["rows"].items() if k.startswith("e2e[") and ":" not in k}
        works = [name for name, cell in e2e.items() if cell["outcome"] == "pass"]
        broken = [
            f"{name} ({evidence(cell.get('reason') or '')})"
            for name, cell in e2e.items()
            if cell["outcome"] in ("broken", "fail")
        ]
        shims = sorted(
            {
                k.split("[")[0]
                for k, cells in m["rows"].items()
                if cells[ver]["outcome"] == "shimmed" and not k.startswith("native")
            }
        )
        line = f"extraction works for {', '.join(works)}" if works else "extraction works for no model"
        line += f" through shims {', '.join(shims)}" if shims else " with no shim"
        if broken:
            line += f"; broken for {'; '.join(broken)}"
        if c["status"] != "pass":
            line += f" [{c['status']}: " + "; ".join(g["what"] for g in c.get("incomplete", [])) + "]"
        out[ver] = line
    return out


#: The answer table's cells: colour, glyph and word per client verdict.
CLIENT_COLORS = {
    "works natively": OK,
    "works with our shims": SHIM,
    "partial": PART,
    "broken": BAD,
    "not runnable here": NOPE,
    "not on the CPU build": NOPE,
    "not observed": UNSEEN,
}


def _client_style() -> dict:
    """{verdict: (colour, glyph, word)}: the labels are the README's (harness.reporting.client_axis.LABELS)."""
    from harness.reporting.client_axis import LABELS

    return {v: (color, *LABELS[v]) for v, color in CLIENT_COLORS.items()}


CLIENT_STYLE = _client_style()
#: What vLLM and CUDA append to every error, which says nothing about the cell.
BOILERPLATE = re.compile(
    r"(CUDA kernel errors might be asynchronously reported[^|]*|For debugging consider passing "
    r"CUDA_LAUNCH_BLOCKING=1[^|]*|Compile with `?TORCH_USE_CUDA_DSA`?[^|]*|Search for `\w+' in "
    r"https://docs\.nvidia\.com/\S*|,? ?please check the stack trace above for the root cause)"
)


def evidence(text: str) -> str:
    """A cell's evidence as a person reads it: whole (the page wraps it), without CUDA's and vLLM's boilerplate."""
    return re.sub(r"\s*\|\s*(\|\s*)+", " | ", BOILERPLATE.sub("", text or "")).strip(" |")


def _clients(m: dict) -> dict | None:
    """The answer first: one row per vLLM build (newest first), one column per speculators release; each cell a
    glyph and a word, its evidence one click away. Narrow enough for a 1,440 px window without scrolling sideways."""
    from harness.reporting.client_axis import CLIENTS, build_mark

    if not m.get("clients"):
        return None
    rows = []
    for c in reversed(m["columns"]):
        cells = []
        for ver in CLIENTS:
            cell = m["clients"][ver].get(c["version"], {"verdict": "not observed", "why": "no cell"})
            color, glyph, word = CLIENT_STYLE[cell["verdict"]]
            word += (": " + ", ".join(cell["models"])) if cell.get("models") else ""
            word += "" if cell.get("complete", True) else " (incomplete)"
            word += build_mark(cell, " · {}")  # "works · CUDA": narrow enough for 1,440 px
            cells.append(
                {
                    "release": ver,
                    "verdict": cell["verdict"],
                    "color": color,
                    "glyph": glyph,
                    "word": word,
                    "evidence": evidence(_client_detail(cell)),
                }
            )
        rows.append({"version": c["version"], "status": c["status"], "cells": cells})
    legend = [(verdict, color, glyph, word) for verdict, (color, glyph, word) in CLIENT_STYLE.items()]
    return {"releases": list(CLIENTS.items()), "rows": rows, "legend": legend}


def _client_detail(cell: dict) -> str:
    """A client cell's evidence: why, whose fault, the build and the committed files; the CPU build's cell beside
    a CUDA one."""
    lines = [cell.get("why") or ""]
    if cell.get("fault"):
        lines.append(f"fault: {cell['fault']}")
    lines.append(f"build: {cell.get('build', 'cpu')}; evidence: {', '.join(cell.get('evidence') or []) or 'none'}")
    if cell.get("cpu"):
        cpu = cell["cpu"]
        lines.append(
            f"on the CPU build: {cpu['verdict']}: {cpu.get('why') or ''} ({', '.join(cpu.get('evidence') or [])})"
        )
    return "\n".join(x for x in lines if x)


def _model_of(key: str) -> str:
    inner = key[key.index("[") + 1 : -1] if "[" in key else ""
    return inner.removeprefix("tiny-").replace("-", "_") if inner else "all"


#: The page's style and script (inline: the page fetches nothing).
CSS = (
    "body{font:13px system-ui,sans-serif;margin:1em}table{border-collapse:separate;border-spacing:0}"
    "td,th{border:1px solid #bbb;padding:3px 6px;vertical-align:top;white-space:nowrap}th{background:#f4f4f4}"
    "thead th,#matrix tr:first-child th{position:sticky;top:0;z-index:2}th.side,#matrix th:first-child"
    "{position:sticky;left:0;z-index:1}th.corner{z-index:3;left:0}"
    ".scroll{overflow:auto;max-height:90vh}#clients td.v{min-width:7em}"
    "td[data-verdict='not observed'],td[data-outcome='not observed']{border:1px dashed #888;color:#555;"
    "font-style:italic}td[data-verdict='broken'],td[data-outcome='broken'],td[data-outcome='fail']"
    "{font-weight:600}"
    "details summary{cursor:pointer}details div{max-width:28em;white-space:pre-wrap;overflow-wrap:anywhere;"
    "font-size:11px}"
    ".legend span{display:inline-block;padding:2px 6px;margin:2px;border:1px solid #bbb}"
    "#verdicts li{margin:2px 0}@media (max-width:600px){body{margin:.3em}td,th{padding:2px 3px}}"
)
SCRIPT = (
    "function f(){var m=document.getElementById('model').value,"
    "q=document.getElementById('contract').value.toLowerCase();"
    "document.querySelectorAll('tr.row').forEach(function(r){"
    "var ok=(m==='all'||r.dataset.model===m||r.dataset.model==='all')&&r.dataset.key.toLowerCase().indexOf(q)>=0;"
    "r.style.display=ok?'':'none';});}"
    "document.getElementById('model').onchange=f;document.getElementById('contract').oninput=f;"
    # A link to a cell (matrix.html#twophase@0.16.0) clicks it: its evidence opens as for a user's click.
    "function g(){var c=document.getElementById(decodeURIComponent(location.hash.slice(1)));if(!c)return;"
    "if(!c.querySelector('details').open){c.querySelector('summary').click();}"
    # The table's scroll box is brought to the top of the window (its sticky headers with it), then the cell
    # is centred inside the box: on a narrow window the linked column comes into view under its header. Again
    # after load, since the browser's own jump to the fragment comes later and puts the cell at the very top.
    "var b=c.closest('.scroll');if(!b){c.scrollIntoView({block:'center',inline:'center'});return;}"
    "b.scrollIntoView({block:'start'});var br=b.getBoundingClientRect(),cr=c.getBoundingClientRect();"
    "b.scrollLeft+=cr.left-br.left-(b.clientWidth-cr.width)/2;b.scrollTop+=cr.top-br.top-b.clientHeight/2;}"
    "window.onhashchange=g;"
    # The release picker shows one speculators release's column (every vLLM build down the side); a window
    # narrower than the whole table starts on the newest release, and a link to a cell on its release.
    "var rs=document.getElementById('release');function h(){var v=rs.value;"
    "document.querySelectorAll('#clients [data-release]').forEach(function(x){"
    "x.style.display=(v==='all'||x.dataset.release===v)?'':'none';});}"
    "if(rs){rs.onchange=h;var t=document.getElementById('clients'),"
    "k=decodeURIComponent(location.hash.slice(1)).match(/^client([^@]+)@/);"
    "if(k){rs.value=k[1];}else if(t&&t.scrollWidth>window.innerWidth){rs.value=rs.options[rs.options.length-1].value;}h();}"
    "g();window.addEventListener('load',function(){setTimeout(g,0);});"
)


def _detail(cell: dict) -> str:
    return "\n".join(
        x
        for x in (
            f"expected: {cell.get('expected')}" if cell.get("expected") else "",
            f"shim: {cell.get('shim')}" if cell.get("shim") else "",
            f"error: {cell.get('error')}" if cell.get("error") else "",
            "proof: {result}: {evidence}".format(**cell["proof"]) if cell.get("proof") else "",
            cell.get("reason") or "",
            f"observed by the {cell['run']}" if cell.get("run") else "",
        )
        if x
    )


def page_context(m: dict) -> dict:
    """What the template shows, as plain values (the template escapes every one of them)."""
    cols = m["columns"]
    columns = [
        {
            "version": c["version"],
            "status": c["status"],
            "color": COLORS.get(c["status"], "#f4f4f4"),
            "gaps": "; ".join(g["what"] for g in c.get("incomplete", [])),
            "wall_s": str(c.get("wall_s", "—")),
            "bench": bench_cell(c.get("benchmark")),
        }
        for c in cols
    ]
    rows = [
        {
            "key": key,
            "model": _model_of(key),
            "cells": [
                {
                    "version": c["version"],
                    "outcome": cells[c["version"]]["outcome"],
                    "color": COLORS.get(cells[c["version"]]["outcome"], "#fff"),
                    "short": short_cell(cells[c["version"]], markdown=False),
                    "evidence": evidence(_detail(cells[c["version"]])),
                }
                for c in cols
            ],
        }
        for key, cells in m["rows"].items()
    ]
    return {
        "css": CSS,
        "script": SCRIPT,
        "clients": _clients(m),
        "verdicts": list(verdicts(m).items()),
        "legend": [(k, COLORS[k], t) for k, t in LEGEND],
        "proof_mark": PROOF_MARK,
        "models": sorted({_model_of(k) for k in m["rows"]} - {"all"}),
        "columns": columns,
        "rows": rows,
    }


def to_html(m: dict) -> str:
    """Self-contained (inline CSS and a few lines of script, nothing fetched): the answer table, a verdict line per
    version, a colour legend, filters by model and contract, and each cell's evidence one click away (<details>).
    Rendered by jinja2 with autoescaping from templates/matrix.html.j2."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("harness.reporting", "templates"), autoescape=True, keep_trailing_newline=True
    )
    return env.get_template("matrix.html.j2").render(page_context(m))


def write(report_dir: Path = REPORTS) -> dict:
    """Merge the env reports in `report_dir` and write reports/matrix.{json,md,html}."""
    from harness.reporting.report import write_atomic

    m = merge(report_dir)
    write_atomic(Path(report_dir) / "matrix.json", json.dumps(m, indent=2, default=str) + "\n")
    write_atomic(Path(report_dir) / "matrix.md", to_markdown(m))
    write_atomic(Path(report_dir) / "matrix.html", to_html(m))
    return m
