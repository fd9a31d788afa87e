"""The matrix's client axis: for each speculators release the suites drive and each vLLM build, one verdict.

Answers "which vLLM versions work with speculators X?" from what each env report observed, never from what a
release declares:
- **works natively**: speculators' code ran as shipped and agreed with the reference;
- **works with our shims (which)**: it ran only through the harness's shims, named;
- **partial (which models)**: it works for some of the models it was run on and not for the others (each said);
- **broken (why)**: it does not run, or disagrees, and no shim restores it (the expectation's reason);
- **not runnable here (why)**: the build has no such path (e.g. no native export), or the client's declared
  range excludes it, or the build could not be installed here;
- **not on the CPU build (why)**: the server path failed on vLLM's CPU build (vLLM's error is the fault); what a
  CUDA user gets is the CUDA cell, where one was observed;
- **not observed**: the build's report predates this client's rows.
Every cell says the build it was observed on (`build`: cpu or cuda-sm90), the committed file that holds its
evidence (`evidence`) and, where it does not work, whose fault that is (`fault`). Where both builds were observed,
the CUDA cell is the answer and the CPU cell rides along (`cpu`). The per-contract rows behind a CPU verdict are
the matrix's own rows for that build.
"""

from __future__ import annotations

from harness.subjects.releases import CLIENT_FAILS, client_row
from harness.subjects.releases import CLIENTS as SERVER_CLIENTS

WORKS, SHIMMED, PARTIAL, BROKEN, NOT_RUNNABLE, NOT_ON_CPU, NOT_OBSERVED = (
    "works natively",
    "works with our shims",
    "partial",
    "broken",
    "not runnable here",
    "not on the CPU build",
    "not observed",
)
#: Whose fault a failure is, by where it happened.
CPU_BUILD_FAULT = "vLLM's CPU build"
#: The builds a cell can be observed on: vLLM's CPU wheel (the tox envs) and its CUDA wheel on sm_90 (H100/H200).
CPU, CUDA = "cpu", "cuda-sm90"
#: The clients, in release order, with what the harness drives of each.
#: What each server-path release's client does differently (harness.clients.vllm_client.ClientApi reads it from the code).
SERVER_CLIENT_HOW = {
    "0.5.0": "its vllm_client: token ids in, the file path out, no lock protocol",
    "0.6.0": "its vllm_client: an item in, waits on the writer's .lock (0.7.0 differs only in chat requests)",
    "0.8.0": "its vllm_client: also takes kv_transfer_params['handle']; its connectors from hs-connectors",
    "0.9.0": "its vllm_client: returns the handle with kv_transfer_params",
}
CLIENTS = {
    "0.3.0": "in-process generator (vllm_hidden_states_generator), through the harness's shims",
    "0.4.0": "in-process generator as shipped (its own ports of the fixes), tiny Llama",
    **{
        v: "vllm serve with vLLM's native export, " + SERVER_CLIENT_HOW.get(v, "its vllm_client")
        for v in SERVER_CLIENTS
    },
}
SECOND_CLIENT_CHECK = "speculators 0.4.0 (second client) agrees"


def _cell(
    verdict: str,
    why: str = "",
    shims: list[str] | None = None,
    complete: bool = True,
    models: list[str] | None = None,
    build: str = CPU,
    evidence: list[str] | None = None,
    fault: str | None = None,
) -> dict:
    """`complete`: False where the run behind the verdict did not observe everything (its cell says so);
    `models`: for a partial verdict, the models it works on; `build`, `evidence`, `fault`: see the module."""
    return {
        "verdict": verdict,
        "why": why,
        "shims": shims or [],
        "complete": complete,
        **({"models": models} if models else {}),
        "build": build,
        "evidence": evidence or [],
        "fault": fault,
    }


def fault_of(release: str, results: dict[str, dict]) -> str:
    """Whose fault a server-path release's failure is, from its per-model results: its own client's, or vLLM's."""
    texts = [
        str(r.get("verdict") or r.get("measured") or "")
        for r in results.values()
        if not r.get("agrees", r.get("result") == "pass")
    ]
    if any(t.startswith(CLIENT_FAILS) for t in texts):
        return f"speculators {release}'s client"
    return "vLLM (server side)"


def _first_client(rep: dict, status: str) -> dict:
    """speculators 0.3.0: the env run itself (its contract rows and e2e checks against transformers)."""
    if status == "fail":
        bad = [c["contract"] for c in rep.get("contracts", []) if c.get("expected") not in (None, c["outcome"])]
        return _cell(
            BROKEN,
            "the run failed" + (f": {', '.join(bad)} not as expected" if bad else ""),
            fault="the contract rows say (matrix.html)",
        )
    shims = sorted(
        {
            c["contract"].split("[")[0]
            for c in rep.get("contracts", [])
            if c["outcome"] == "shimmed" and not c["contract"].startswith("native")
        }
    )
    broken_e2e = sorted({e["model"] for e in rep.get("e2e", []) if e["result"] == "fail" and ":" not in e["model"]})
    why = ", ".join(shims)
    if broken_e2e:
        why += f"; vLLM's own numbers are wrong for {', '.join(broken_e2e)} (expected broken)"
    if status != "pass":
        why += f" [run {status}]"
    return _cell(
        SHIMMED if shims else WORKS,
        why,
        shims,
        complete=status == "pass",
        fault="vLLM (its own numbers)" if broken_e2e else None,
    )


def _second_client(rep: dict) -> dict:
    seen = [e for e in rep.get("e2e", []) if e["check"] == SECOND_CLIENT_CHECK]
    if not seen:
        return _cell(NOT_OBSERVED, "the report has no speculators 0.4.0 check")
    e = seen[0]
    if e["result"] == "n/a":
        return _cell(NOT_RUNNABLE, e["measured"])
    return _cell(
        WORKS if e["result"] == "pass" else BROKEN,
        e["measured"],
        fault=None if e["result"] == "pass" else "speculators 0.4.0 or vLLM: the row says",
    )


def _build(rep: dict) -> str:
    return CUDA if (rep.get("platform") or {}).get("device_type") == "cuda" else CPU


def _native_client(rep: dict, version: str) -> dict:
    seen = [e for e in rep.get("e2e", []) if e["model"].startswith(client_row("", version)) and "agrees" in e["check"]]
    if not seen:
        return _unseen_native_client(rep)
    if all(e["result"] == "n/a" for e in seen):
        return _cell(NOT_RUNNABLE, seen[0]["measured"])
    if all(e["result"] == "pass" for e in seen):
        models = ", ".join(e["model"].split(":", 1)[1] for e in seen)
        shimmed = any("sync_writer" in e["measured"] for e in seen)
        return _cell(
            SHIMMED if shimmed else WORKS,
            ("through harness.native.sync_writer (a CPU build's connector) on " if shimmed else "on ") + models,
            ["sync_writer"] if shimmed else [],
        )
    return _failing_native_client(rep, version, seen)


def _unseen_native_client(rep: dict) -> dict:
    """No row of this client: not runnable where the build has no native export at all, else not observed."""
    path = next((c for c in rep.get("contracts", []) if c["contract"] == "native-path"), None)
    if path is not None and path["outcome"] == "n/a":  # observed: this build has no export for any client
        return _cell(NOT_RUNNABLE, f"native-path: {path.get('reason') or 'no native hidden-state export'}")
    return _cell(NOT_OBSERVED, "the report predates this client's rows")


def _failing_native_client(rep: dict, version: str, seen: list[dict]) -> dict:
    """Some model's check failed: partial where another passed, and whose fault it is."""
    failed = next(e for e in seen if e["result"] != "pass")
    why = f"{failed['model'].split(':', 1)[1]}: {failed['measured']}"
    passing = [e["model"].split(":", 1)[1] for e in seen if e["result"] == "pass"]
    fault = fault_of(version, {e["model"]: e for e in seen})
    # Observed on the CPU build only, a failure on the server side is the CPU build's: CUDA may differ (and did, at
    # 0.17-0.20), so it is never "broken" without a CUDA observation. The client's own code runs the same on both.
    cpu_only = _build(rep) == CPU and not fault.startswith("speculators")
    if cpu_only:
        fault = CPU_BUILD_FAULT
    if passing:  # some models work: say which, never collapse it to broken
        return _cell(PARTIAL, f"works on {', '.join(passing)}; not on {why}", models=passing, fault=fault)
    return _cell(NOT_ON_CPU if cpu_only else BROKEN, why, fault=fault)


def cells(rep: dict, status: str, evidence: str = "") -> dict[str, dict]:
    """One env report's verdict for every client (keyed by speculators version); `evidence`: the report's path."""
    got = {
        "0.3.0": _first_client(rep, status),
        "0.4.0": _second_client(rep),
        **{v: _native_client(rep, v) for v in SERVER_CLIENTS},
    }
    for cell in got.values():
        cell.update(evidence=[evidence] if evidence else [], build=_build(rep))
        if cell["verdict"] == NOT_RUNNABLE and cell["build"] == CPU and str(cell["why"]).startswith(BUILD_LIMITED):
            cell.update(verdict=NOT_ON_CPU, fault=CPU_BUILD_FAULT)
    return got


def shown(cpu: dict | None, cuda: dict | None) -> dict:
    """The cell the answer shows: CUDA's where it was observed (the CPU cell beside it), else the CPU build's."""
    if cuda is None:
        return cpu or _cell(NOT_OBSERVED, "no report observed it")
    if cpu is None:
        return cuda
    return dict(cuda, cpu={k: cpu[k] for k in ("verdict", "why", "evidence", "fault") if k in cpu})


def not_runnable(reason: str) -> dict[str, dict]:
    return {v: _cell(NOT_RUNNABLE, reason) for v in CLIENTS}


def to_markdown(m: dict) -> list[str]:
    cols = m["columns"]
    lines = [
        "## Which speculators works with which vLLM",
        "",
        "| speculators | how | " + " | ".join(c["version"] for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for ver, how in CLIENTS.items():
        row = m["clients"][ver]
        lines.append(f"| {ver} | {how} | " + " | ".join(_short(row[c["version"]]) for c in cols) + " |")
    lines += [
        "",
        "Each cell: works natively / works with our shims (which) / partial (which models) / broken / not "
        "runnable here / not on the CPU build / not observed, then the build it was observed on (CUDA: an H100 "
        "or H200; CPU: vLLM's CPU wheel);",
        "the reasons, the evidence files and whose fault are in matrix.json (`clients`) and matrix.html.",
    ]
    return lines


def _short(cell: dict) -> str:
    return _verdict_text(cell) + ("" if cell.get("complete", True) else " (incomplete)") + build_mark(cell)


#: How a cell names its build where it shows one.
BUILD_WORD = {CPU: "CPU", CUDA: "CUDA"}


def build_mark(cell: dict, form: str = " ({})") -> str:
    """The build after an observed verdict, in `form` (` (CUDA)` in Markdown, ` · CUDA` on the page); nothing for
    a verdict that observed nothing."""
    if cell["verdict"] in (NOT_OBSERVED, NOT_RUNNABLE, NOT_ON_CPU):
        return ""
    return form.format(BUILD_WORD.get(cell.get("build", CPU), cell.get("build")))


def label(cell: dict) -> str:
    """The verdict as a page shows it: never without saying that its run was incomplete."""
    return cell["verdict"] + ("" if cell.get("complete", True) else " (run incomplete)")


def _verdict_text(cell: dict) -> str:
    v = cell["verdict"]
    if v == SHIMMED:
        shims = cell["shims"]
        return f"works, {len(shims)} shims" if len(shims) > 2 else "works with " + " + ".join(shims)
    if v == PARTIAL:
        return "partial: " + ", ".join(cell.get("models", []))
    return {
        WORKS: "works",
        BROKEN: "**broken**",
        NOT_RUNNABLE: "not runnable",
        NOT_ON_CPU: "not on the CPU build",
        NOT_OBSERVED: "not observed",
    }[v]


#: The README's answer block is generated from reports/matrix.json between these markers (`harness matrix`
#: rewrites it; a unit test holds the committed README to the committed matrix).
ANSWER_BEGIN = "<!-- answer: generated from reports/matrix.json by `python -m harness matrix`; do not edit -->"
ANSWER_END = "<!-- end of answer -->"
#: One label per verdict, shared by the README's table (the word; "broken" in bold), the page (glyph and word) and
#: the docs that explain them.
LABELS = {
    WORKS: ("✓", "works"),
    SHIMMED: ("✓", "shims"),
    PARTIAL: ("◐", "partial"),
    BROKEN: ("✗", "broken"),
    NOT_RUNNABLE: ("—", "no path"),
    NOT_ON_CPU: ("–", "not on the CPU build"),
    NOT_OBSERVED: ("?", "not observed"),
}
WORD = {verdict: f"**{word}**" if verdict == BROKEN else word for verdict, (_, word) in LABELS.items()}


#: How a "not runnable" reason starts when the vLLM has the path but the build the harness made cannot run it
#: (harness.native.probes.availability: 0.34 on vLLM's standalone CPU runner, which refuses the native export).
BUILD_LIMITED = "not runnable on this build"


def answer_table(m: dict) -> str:
    """Which vLLM works with which speculators release, one row per vLLM build, one word a cell (the matrix page
    and matrix.json say which shims and why)."""
    releases = list(CLIENTS)
    lines = [
        ANSWER_BEGIN,
        "| vLLM | CPU run | TP > 1 | " + " | ".join(f"speculators {r}" for r in releases) + " |",
        "|---|---|---|" + "---|" * len(releases),
    ]
    for col in reversed(m["columns"]):
        ver = col["version"]
        cells = []
        for r in releases:
            cell = m["clients"][r].get(ver, {"verdict": NOT_OBSERVED})
            word = WORD[cell["verdict"]] + (f" ({', '.join(cell['models'])})" if cell.get("models") else "")
            cells.append(word + ("" if cell.get("complete", True) else " (partial run)") + build_mark(cell))
        tp = ", ".join(
            f"{n}" + ("" if r == "pass" else " (fail)") for n, r in (col.get("tensor_parallel") or {}).items()
        )
        lines.append(f"| {ver} | {col['status']} | {tp or '—'} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [ANSWER_END])


def with_answer(readme: str, m: dict) -> str:
    """`readme` with its answer block regenerated (unchanged where it has no markers)."""
    start, end = readme.find(ANSWER_BEGIN), readme.find(ANSWER_END)
    if start < 0 or end < start:
        return readme
    return readme[:start] + answer_table(m) + readme[end + len(ANSWER_END) :]


def rewrite_readme(path, m: dict) -> None:
    """Regenerate the answer block of the README at `path` from the merged matrix `m`."""
    path.write_text(with_answer(path.read_text(), m))
