"""A gate decision (`harness.gate.decide.verdict.Gate`) as its two reports: JSON for tools, Markdown for people.

JSON report (`reports/gate-<from>-to-<to>.json`, schema "harness-gate/1"):

* `schema`, `generated_at`, `from`, `to`, `verdict`, `exit_code`, `error` (why undecided, or null)
* `speculators`, `surface`: the speculators version and the used-surface fixture read
* `sources`: per version, `root` (the cached sources) and `origin` ("cache" or the archive)
* `contracts`: id -> {`status`: unchanged | covered | needs-new-shim | broken | not-checked |
  outside, `findings`, `shims`, `note`}; "surface" is speculators' vLLM use outside every contract, "runtime"
  the vLLM use of the harness's worker extension, executor view and transport
* `paths`: contract -> {`reached`: platform -> functions its watched path reaches, `unclassified`, `classified`,
  `compatible`, `neutral`, `observed`}; `unclassified`: [{`contract`, `platform`, `key`, `kind` (changed | new), `evidence`,
  `via`, `diff`}] (`classified`: the same with `classified_by`, the finding of a targeted check inside it;
  `neutral`: the same with `why`, the neutral-edit rule's reason)
* `findings`: [{`contract`, `symbol`, `kind`, `old`, `new`, `evidence` (file:line in the new
  source), `site` (speculators' line), `status` (covered | accepted | uncovered), `shim`,
  `reason`, `detail`}]
* `carried`: deviations already present in the old version, unchanged; `restored`: deviations
  the new version no longer has (a shim there stops being needed)
* `not_checked`: contract -> reasons; `outside`: contract -> {`reason`, `dynamic`}
* `shims`: the shims the new version needs for the findings, sorted
* `allowlist`: {`file`, `entries`, `expired`: [{`pattern`, `reason`, `expires`, `would_accept`}]}
* `timings`: seconds for `sources`, `static` and `total`
"""

from __future__ import annotations

from dataclasses import asdict

from harness.gate.decide.verdict import Gate
from harness.support.report_files import now

SCHEMA = "harness-gate/1"


def to_json(gate: Gate) -> dict:
    return {
        "schema": SCHEMA,
        "generated_at": now(),
        "from": gate.old,
        "to": gate.new,
        "verdict": gate.verdict,
        "exit_code": gate.exit_code,
        "error": gate.error,
        "speculators": gate.meta.get("speculators"),
        "surface": gate.meta.get("surface"),
        "sources": gate.meta.get("sources", {}),
        "contracts": gate.contracts,
        "findings": [asdict(f) for f in gate.findings],
        "carried": [asdict(f) for f in gate.carried],
        "restored": [asdict(f) for f in gate.restored],
        "not_checked": gate.not_checked,
        "outside": gate.outside,
        "shims": gate.shims,
        "observed_worse": gate.observed_worse,
        "static_verdict": gate.static_verdict,
        "observation": gate.observation,
        "paths": gate.paths,
        "unclassified": [c.to_json() for c in gate.unclassified],
        "classified": [c.to_json() for c in gate.classified],
        "neutral": [c.to_json() for c in gate.neutral],
        "allowlist": {
            "file": gate.meta.get("allowlist"),
            "entries": gate.meta.get("allowlist_entries", []),
            "expired": gate.expired,
        },
        "timings": gate.meta.get("timings", {}),
    }


def _cell(text) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def markdown(gate: Gate) -> str:
    icon = {0: "✅", 1: "❌", 3: "🔎", 5: "⚠️"}.get(gate.exit_code, "⚠️")
    lines = [f"## {icon} vLLM gate {gate.old} → {gate.new}: **{gate.verdict}** (exit {gate.exit_code})", ""]
    if gate.error:
        return "\n".join(lines + [f"Could not decide: {gate.error}", ""])
    t = gate.meta.get("timings", {})
    lines += [
        f"speculators {gate.meta.get('speculators')} (surface `{gate.meta.get('surface')}`); static reading "
        f"of both versions' sources, nothing imported. Sources {t.get('sources', 0):.1f} s, static "
        f"{t.get('static', 0):.1f} s.",
        "",
    ]
    lines += _observation_section(gate)
    lines += _warnings(gate) + _findings_table(gate) + _unclassified_section(gate) + _neutral_section(gate)
    if gate.shims:
        lines += ["**Shims the new version needs for these changes:** " + ", ".join(f"`{s}`" for s in gate.shims), ""]
    lines += _contracts_table(gate) + _open_and_carried(gate)
    return "\n".join(lines)


def _warnings(gate: Gate) -> list[str]:
    """Contracts the candidate's own env observed worse than expected; allow-list entries that expired."""
    lines = []
    for w in gate.observed_worse:
        lines.append(
            f"> **Observed worse than expected** in the candidate's env ({w['report']}): `{w['contract']}` "
            f"is {w['outcome']}, expected {w['expected']}: {_cell(w['reason'])}"
        )
    if gate.observed_worse:
        lines.append("")
    for e in gate.expired:
        would = f"; it would accept {', '.join(f'`{s}`' for s in e['would_accept'])}" if e["would_accept"] else ""
        lines.append(
            f"> **Expired allow-list entry** `{e['pattern']}` (expired {e['expires']}: {e['reason']}) "
            f"no longer accepts findings{would}."
        )
    if gate.expired:
        lines.append("")
    return lines


def _findings_table(gate: Gate) -> list[str]:
    if not gate.findings:
        if gate.unclassified:
            return []
        return [
            "No change in anything speculators relies on"
            + (" (watched paths read: no unclassified change)." if gate.paths else "."),
            "",
        ]
    lines = [
        "| contract | change | symbol | old → new | evidence (new source) | resolution |",
        "|---|---|---|---|---|---|",
    ]
    for f in gate.findings:
        open_label = (
            "**BROKEN**" if gate.contracts.get(f.contract, {}).get("status") == "broken" else "**NEEDS-NEW-SHIM**"
        )
        how = {"covered": f"covered by `{f.shim}`", "accepted": "accepted (allow-list)"}.get(f.status, open_label)
        lines.append(
            f"| {f.contract} | {f.kind} | `{_cell(f.symbol)}` | {_cell(f.old)} → {_cell(f.new)} | "
            f"`{_cell(f.evidence)}` | {how}: {_cell(f.reason)} |"
        )
    return lines + [""]


def _observation_section(gate: Gate) -> list[str]:
    """The candidate as observed on the rows that settle the reading: what decided the verdict."""
    obs = gate.observation
    if obs is None:
        return []
    took = f" in {obs['seconds']:.0f} s" if obs.get("seconds") is not None else ""
    lines = [
        f"**Decided by observation**: {obs['source']}{took} says **{obs['verdict']}** "
        f"(the static reading alone: {gate.static_verdict}).",
        "",
    ]
    if obs.get("error"):
        return lines + [f"Could not observe the candidate: {_cell(obs['error'])}", ""]
    lines += ["| row | observed | baseline | says | why |", "|---|---|---|---|---|"]
    for r in obs["rows"]:
        lines.append(f"| {r['row']} | {r['outcome']} | {r['baseline'] or ''} | {r['says']} | {_cell(r['why'])[:200]} |")
    return lines + [""]


def _unclassified_section(gate: Gate) -> list[str]:
    if not gate.unclassified:
        return []
    settled = gate.observation is not None and gate.observation["verdict"] != "UNDECIDED"
    lines = [
        f"**{len(gate.unclassified)} change(s) on a watched path no check classifies** "
        + (
            "(settled by the observation above: the rows owning these paths were observed on the candidate):"
            if settled
            else "(REVIEW: read each diff and say whether the contract still holds, or run the candidate with "
            "`--dynamic`):"
        ),
        "",
        "| contract | platform | function | change | evidence | reached from |",
        "|---|---|---|---|---|---|",
    ]
    for c in gate.unclassified:
        lines.append(
            f"| {c.contract} | {c.platform} | `{_cell(c.key)}` | {c.kind} | `{c.evidence}` | `{_cell(c.via)}` |"
        )
    lines += ["", "<details><summary>diffs</summary>", ""]
    for c in gate.unclassified:
        if c.diff:
            lines += [f"`{c.key}` (`{c.evidence}`):", "```diff", c.diff, "```", ""]
    return lines + ["</details>", ""]


def _neutral_section(gate: Gate) -> list[str]:
    """The changes the neutral-edit rule classified (docs/gate.md), with why and their diffs: read, never open."""
    if not gate.neutral:
        return []
    lines = [
        f"**{len(gate.neutral)} neutral change(s) on a watched path** (a rename of locals, logging calls, "
        "annotations: nothing speculators reads can change):",
        "",
        "<details><summary>diffs</summary>",
        "",
    ]
    for c in gate.neutral:
        lines += [f"`{c.key}` (`{c.evidence}`): {c.why}", "```diff", c.diff, "```", ""]
    return lines + ["</details>", ""]


def _path_cell(p: dict | None) -> str:
    """A contract's watched path in one cell: functions reached per platform and what changed on them."""
    if p is None:
        return ""
    if p["unclassified"]:
        state = f"{p['unclassified']} changed-unclassified"
    else:
        state = "unchanged" if not (p["classified"] or p["compatible"] or p.get("neutral")) else ""
    return (
        ", ".join(f"{k} {v}" for k, v in p["reached"].items())
        + " functions; "
        + state
        + (f", {p['classified']} classified" if p["classified"] else "")
        + (f", {p['compatible']} compatible" if p["compatible"] else "")
        + (f", {p['neutral']} neutral" if p.get("neutral") else "")
        + (", observed on the candidate" if p["observed"] else "")
    )


def _contracts_table(gate: Gate) -> list[str]:
    lines = ["| contract | status | findings | watched path | note |", "|---|---|---|---|---|"]
    for cid, c in gate.contracts.items():
        path = _path_cell(gate.paths.get(cid))
        lines.append(f"| {cid} | {c['status']} | {c['findings']} | {path} | {_cell(c['note'])} |")
    return lines + [""]


def _open_and_carried(gate: Gate) -> list[str]:
    """What is not checked, what the new version no longer needs, and deviations carried from the old one."""
    lines = []
    if gate.not_checked:
        lines += ["**Not checked** (the gate cannot decide while these are open):", ""]
        lines += [f"- {c}: {_cell('; '.join(r))}" for c, r in gate.not_checked.items()] + [""]
    if gate.restored:
        gone = ", ".join(f"`{f.symbol}` ({f.contract})" for f in gate.restored)
        lines += [f"No longer needed in {gate.new}: {gone}", ""]
    if gate.carried:
        head = f"{len(gate.carried)} deviation(s) already present in {gate.old}, unchanged"
        lines += [
            f"<details><summary>{head}</summary>",
            "",
            *[
                f"- {f.contract}: `{_cell(f.symbol)}` = {_cell(f.new)} ({f.status}{': ' + f.shim if f.shim else ''})"
                for f in gate.carried
            ],
            "",
            "</details>",
            "",
        ]
    return lines
