"""An env report read by people: its Markdown page (`reports/<env>.md`) and the terminal summary of an observed run.
Rendering only; what a report holds and how it is judged is `harness.reporting.report`."""

from __future__ import annotations


def markdown(rep: dict) -> str:
    v, p = rep["versions"], rep["platform"]
    lines = [
        f"# Conformance report: `{rep['env']}` — {rep['status'].upper()}",
        "",
        counts_line(rep),
        "",
        f"vLLM {v.get('vllm')} ({v.get('vllm_distribution')}), speculators {v.get('speculators')}, torch {v.get('torch')}, "
        f"transformers {v.get('transformers')}, Python {v.get('python')}; platform {p.get('device_type')} "
        f"({p.get('machine')}, {p.get('cpus')} CPUs"
        + (f"; {p['cpu']}" if p.get("cpu") else "")
        + f"). Generated {rep['generated_at']}.",
        "",
        *build_lines(rep),
        *_contract_table(rep["contracts"]),
        *_status_lists(rep),
        *_e2e_section(rep["e2e"]),
        *_tiers_section(rep["tiers"]),
        *_timings_section(rep.get("timings") or {}),
    ]
    if rep["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in rep["notes"]]
    return "\n".join(lines) + "\n"


def _contract_table(contracts: list[dict]) -> list[str]:
    """One row per contract observed here; the n/a ones collapsed below, one line per reason."""
    lines = ["| contract | observed | expected | shim | proof | evidence |", "|---|---|---|---|---|---|"]
    na_contracts: dict[str, list[str]] = {}
    for c in contracts:
        held = c.get("expected") is not None  # an observed build holds nothing to expectations: no mismatch
        evidence = c["unshimmed"]["error"] if c["unshimmed"] and not c["unshimmed"]["ok"] else c["reason"]
        if c["outcome"] == "n/a" and c.get("expected") in ("n/a", None):
            na_contracts.setdefault(plain(evidence), []).append(c["contract"])
            continue
        mark = " **MISMATCH**" if held and c.get("expected") != c["outcome"] else ""
        proof = (c.get("proof") or {}).get("result") or "—"
        lines.append(
            f"| {c['contract']} | {c['outcome']}{mark} | {c.get('expected') or '—'} | "
            f"{c.get('shim') or ''} | {proof} | {cell(evidence)} |"
        )
    return lines + collapsed("Contracts n/a here", na_contracts)


def _status_lists(rep: dict) -> list[str]:
    """What made the run incomplete, and the contracts its expectations did not match."""
    lines: list[str] = []
    if rep.get("incomplete"):
        lines += ["", "**Incomplete:**"] + [f"- {g['what']}" for g in rep["incomplete"]]
    for label, key in (
        ("Stale expectations", "stale_expectations"),
        ("Not observed", "not_observed"),
        ("Without expectation", "unexpected"),
    ):
        if rep.get(key):
            lines += ["", f"**{label}:** " + ", ".join(rep[key])]
    return lines


def _e2e_section(e2e: list[dict]) -> list[str]:
    if not e2e:
        return []
    lines = [
        "",
        "## End to end (speculators' generator through the shims)",
        "",
        "| model | check | result | measured |",
        "|---|---|---|---|",
    ]
    na_checks: dict[str, list[str]] = {}
    for e in e2e:
        if e["result"] == "n/a":
            na_checks.setdefault(plain(e.get("measured", "")), []).append(f"{e['model']}: {e['check']}")
            continue
        lines.append(f"| {e['model']} | {e['check']} | {e['result']} | {cell(e.get('measured', ''))} |")
    return lines + collapsed("Checks n/a here", na_checks)


def _tiers_section(tiers: dict) -> list[str]:
    if not tiers:
        return []
    lines = [
        "",
        "## Wall time per tier",
        "",
        "| tier | tests | passed | failed | skipped | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for name, t in sorted(tiers.items()):
        lines.append(f"| {name} | {t['tests']} | {t['passed']} | {t['failed']} | {t['skipped']} | {t['wall_s']:.1f} |")
    return lines


def _timings_section(tm: dict) -> list[str]:
    if not tm.get("slowest"):
        return []
    starts = tm.get("generator_starts", {})
    return [
        "",
        "## Where the time went",
        "",
        f"Whole session {tm.get('session_s', 0):.0f} s; shim proofs {tm.get('proofs_s', 0):.0f} s; "
        f"{starts.get('count', 0)} generator start-ups in this process, {starts.get('total_s', 0):.0f} s "
        f"(median {starts.get('median_s', 0):.1f} s). Slowest tests (setup + call + teardown):",
        "",
        "| test | s |",
        "|---|---|",
    ] + [f"| `{t}` | {sec:.1f} |" for t, sec in tm["slowest"]]


def plain(text) -> str:
    """One line of text: whitespace runs (newlines included) become one space; never cut."""
    return " ".join(str(text or "").split())


def cell(text) -> str:
    """A Markdown table cell holding the whole text (pipes escaped)."""
    return plain(text).replace("|", "\\|")


def collapsed(title: str, by_reason: dict[str, list[str]]) -> list[str]:
    """n/a rows, one line per reason (the same reason is never repeated row after row)."""
    if not by_reason:
        return []
    lines = ["", f"**{title}** ({sum(map(len, by_reason.values()))}, one line per reason):", ""]
    return lines + [f"- {reason or 'no reason given'}: {', '.join(keys)}" for reason, keys in by_reason.items()]


def counts_line(rep: dict) -> str:
    """The run in one line: tests, contract outcomes, end-to-end results."""
    t = rep.get("tests") or {}
    outcomes: dict[str, int] = {}
    for c in rep["contracts"]:
        outcomes[c["outcome"]] = outcomes.get(c["outcome"], 0) + 1
    e2e: dict[str, int] = {}
    for e in rep["e2e"]:
        e2e[e["result"]] = e2e.get(e["result"], 0) + 1
    say = lambda d: ", ".join(f"{n} {k}" for k, n in sorted(d.items(), key=lambda kv: -kv[1])) or "none"  # noqa: E731
    return (
        f"**Tests:** {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, {t.get('skipped', 0)} skipped. "
        f"**Contracts:** {say(outcomes)}. **End to end:** {say(e2e)}."
    )


def build_lines(rep: dict) -> list[str]:
    """What a run on a vLLM the harness built from source, or on a runner the harness chose, observed: said in
    words above the table, since every cell of such a run is about that build and that runner only."""
    b, runtime = rep.get("build"), (rep.get("platform") or {}).get("runtime")
    lines = []
    if b:
        edits = "; ".join(f"{e['file']}: {e['why']}" for e in b.get("edits", [])) or "none"
        lines.append(
            f"**Built from source by the harness** (no CPU wheel of this release exists): {b['sdist']} "
            f"(sha256 {b['sdist_sha256'][:16]}…), oneDNN {b['onednn_tag']} ({b['onednn']}), gcc {b['gcc']}, "
            f"torch {b['torch']}, build environment {', '.join(f'{k}={v}' for k, v in (b.get('env') or {}).items())}; "
            f"edits to the sdist: {edits}. Wheel "
            f"{b['wheel']} (sha256 {b['wheel_sha256'][:16]}…), built {b['built_at']}"
            + (
                f" in {b['build_wall_s']:.0f} s."
                if b.get("incremental") is False
                else " (an incremental build over an earlier compile of the same sdist)."
            )
        )
    if runtime:
        lines.append(f"**Runner:** {runtime}. Contracts that read the model runner describe that runner only.")
    elif b and b.get("runtime_why"):
        lines.append(f"**Runner:** {b['runtime_why']}.")
    return lines + [""] if lines else []


def observed_summary(rep: dict) -> str:
    """What an observed run saw, per contract and per model, and where its draft expectations are."""
    lines = [f"harness: vLLM {rep['versions']['vllm']} observed (not held to expectations):"]
    lines += [f"  {c['contract']:28s} {c['outcome']:8s} {c['reason'][:90]}" for c in rep["contracts"]]
    by_model: dict[str, set] = {}
    for e in rep.get("e2e", []):
        by_model.setdefault(e["model"], set()).add(e["result"])
    lines += [
        f"  e2e {m:24s} "
        + ("n/a" if not r - {"n/a", "measured"} else "pass" if r - {"n/a", "measured"} <= {"pass"} else "FAIL")
        for m, r in sorted(by_model.items())
    ]
    if rep.get("draft"):
        lines.append(f"harness: draft expectations for review: {rep['draft']}")
    return "\n".join(lines)
