"""The mutation run's report: per operator how many mutants were flagged, the missed protocol mutants and the
neutral ones flagged (false alarms), as JSON and Markdown."""

from __future__ import annotations

from dataclasses import asdict

from harness.gate.sweeps.mutants.operators import NEUTRAL, PROTOCOL, Mutant


def by_operator(done: list[Mutant]) -> dict:
    """Per operator: protocol or neutral, how many mutants, how many the gate flagged (not SAFE), on which releases."""
    ops = {}
    for op in PROTOCOL + NEUTRAL:
        mine = [m for m in done if m.operator == op]
        ops[op] = {
            "protocol": op in PROTOCOL,
            "mutants": len(mine),
            "flagged": sum(m.verdict != "SAFE" for m in mine),
            "releases": sorted({m.release for m in mine}),
        }
    return ops


def summarise(done: list[Mutant], releases: list[str], dropped: int, seconds: float, per_operator: int) -> dict:
    ops = by_operator(done)
    protocol = [m for m in done if m.protocol]
    neutral = [m for m in done if not m.protocol]
    missed = [m for m in protocol if m.verdict == "SAFE"]
    alarms = [m for m in neutral if m.verdict != "SAFE"]
    return {
        "schema": "harness-gate-mutants/1",
        "releases": releases,
        "per_operator": per_operator,
        "mutants": len(done),
        "operators": len([o for o in ops.values() if o["mutants"]]),
        "dropped_unparsable": dropped,
        "protocol": {
            "mutants": len(protocol),
            "flagged": len(protocol) - len(missed),
            "detection": round((len(protocol) - len(missed)) / len(protocol), 4) if protocol else None,
        },
        "neutral": {"mutants": len(neutral), "false_alarms": len(alarms)},
        "by_operator": ops,
        "verdicts": {v: sum(m.verdict == v for m in done) for v in sorted({m.verdict for m in done})},
        "missed": [_row(m) for m in missed],
        "false_alarms": [_row(m) for m in alarms],
        "all": [_row(m) for m in done],
        "seconds": seconds,
    }


def _row(m: Mutant) -> dict:
    d = asdict(m)
    d.pop("source")
    d.pop("extra")
    return d


def markdown(rep: dict) -> str:
    p, n = rep["protocol"], rep["neutral"]
    lines = [
        f"# The gate against one-change mutants of vLLM {', '.join(rep['releases'])}",
        "",
        f"{rep['mutants']} mutants, {rep['operators']} operators (at most {rep['per_operator']} per operator and "
        f"release, a seeded sample of each operator's sites); {rep['dropped_unparsable']} candidates dropped "
        f"because they did not parse. Protocol mutants flagged (not SAFE): **{p['flagged']}/{p['mutants']}"
        f"** ({(p['detection'] or 0) * 100:.1f} %); neutral mutants flagged: **{n['false_alarms']}/"
        f"{n['mutants']}**. Verdicts: " + ", ".join(f"{k} {v}" for k, v in rep["verdicts"].items()) + ".",
        "",
        "| operator | kind | releases | mutants | flagged | missed / false alarms |",
        "|---|---|---|---|---|---|",
    ]
    for op, o in rep["by_operator"].items():
        bad = o["mutants"] - o["flagged"] if o["protocol"] else o["flagged"]
        lines.append(
            f"| {op} | {'protocol' if o['protocol'] else 'neutral'} | {', '.join(o['releases'])} | "
            f"{o['mutants']} | {o['flagged']} | {bad} |"
        )
    lines.append("")
    for title, rows in (
        ("Missed protocol mutants (came back SAFE)", rep["missed"]),
        ("Neutral mutants flagged (false alarms)", rep["false_alarms"]),
    ):
        lines += [f"## {title}", ""]
        lines += [
            f"- {r['release']} {r['operator']} at `{r['site']}`: {r['verdict']}; {r['reason']}" for r in rows
        ] or ["None."]
        lines.append("")
    return "\n".join(lines)
