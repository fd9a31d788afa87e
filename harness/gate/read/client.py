"""`python -m harness gate --client speculators==0.9.0 --to BUILD [--from BUILD]`: can speculators' current path
(vllm serve with the native export, its connectors from hs-connectors) move to another vLLM?

Static, like the first client's gate: both sides' sources are read (the same cache and artifact forms as --to
takes), never imported. What the path needs of vLLM:
- **the server's export**: the speculative method `extract_hidden_states`, the `ExampleHiddenStatesConnector`
  registered with the connector factory, and `kv_connector_module_path` (how hs-connectors' connectors load);
- **hs-connectors' imports**: every vLLM name its released source imports (fixtures/surfaces/hs-connectors-*.json,
  derived from its wheel by AST) exists where it imports it from;
- **its subclasses**: a private method an hs-connectors class overrides (the FP8 connector's `_write_tensors`)
  exists in the vLLM base with the same parameters, and every abstract method of a vLLM base is implemented.
Each need is a finding per side; the verdict is about the candidate: SAFE when every need holds there, BROKEN
when one does not (a need that held on --from is a regression, one that did not is still missing). Exit 0 / 1;
2 when it cannot decide (no surface recorded for that client, unreadable sources), and UNDECIDED (exit 5) when
the needs hold but the candidate's server runs code no signature can judge: `extract_hidden_states` served by
another implementation than on --from (vLLM 0.34 serves it with the V2 runner's `ExtractHiddenStatesSpeculator`,
0.32 with the V1 runner's `ExtractHiddenStatesProposer`). Only running the client on that build decides it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.subjects.releases import CONNECTORS_OF
from harness.vllm_source.server_path import Tree, needs_of, server_implementation

SAFE, BROKEN, UNDECIDED = "SAFE", "BROKEN", "UNDECIDED"
EXIT = {SAFE: 0, BROKEN: 1, UNDECIDED: 5}


class ClientUnknown(ValueError):
    """--client names a release the gate has no recorded surface for."""


@dataclass
class Need:
    id: str
    what: str
    old: tuple[bool, str] | None  # None: no --from side was read
    new: tuple[bool, str]

    def to_json(self) -> dict:
        return {"id": self.id, "what": self.what, "from": _side(self.old), "to": _side(self.new), "status": self.status}

    @property
    def status(self) -> str:
        if self.new[0]:
            return "holds"
        return "regression" if self.old and self.old[0] else "missing on both"


def _side(x):
    return None if x is None else {"holds": x[0], "evidence": x[1]}


def parse_client(text: str) -> str:
    m = re.fullmatch(r"speculators==(\d+\.\d+\.\d+)", text or "")
    if not m:
        raise ClientUnknown(f"--client {text!r}: expected speculators==X.Y.Z")
    version = m.group(1)
    if version not in CONNECTORS_OF:
        raise ClientUnknown(
            f"--client {text}: no used surface recorded for speculators {version}'s client "
            f"(have: {', '.join(sorted(CONNECTORS_OF))})"
        )
    return version


def connectors_label(version: str) -> str:
    connectors = CONNECTORS_OF[version]
    return f"hs-connectors {connectors}" if connectors else "vLLM's own connector"


def check(version: str, old_root: Path | None, new_root: Path) -> list[Need]:
    out = []
    old_tree, new_tree = (Tree(old_root) if old_root else None), Tree(new_root)
    for nid, what, fn in needs_of(version):
        two = nid.startswith("subclass ")  # an override is one where either side's base defines the method
        old = (fn(old_tree, new_tree, False) if two else fn(old_tree)) if old_tree else None
        out.append(Need(nid, what, old, fn(new_tree, old_tree) if two else fn(new_tree)))
    return out


def not_judged(old_root: Path | None, new_root: Path) -> list[str]:
    """What the candidate runs that the static reading cannot judge, in words (empty: nothing)."""
    new = server_implementation(new_root)
    old = server_implementation(old_root) if old_root else None
    if new is None or old is None or new == old:  # nothing to compare with: the needs alone decide
        return []
    return [
        f"the server's extract_hidden_states runs {new} (on --from: {old}): its behaviour is not a signature; run this "
        f"client through vllm serve on that build to judge it"
    ]


def report(version: str, old: str, new: str, needs: list[Need], unjudged: list[str] | None = None) -> dict:
    failing = [n for n in needs if not n.new[0]]
    unjudged = list(unjudged or [])
    verdict = BROKEN if failing else UNDECIDED if unjudged else SAFE
    return {
        "schema": "harness-gate-client/1",
        "client": f"speculators {version}",
        "connectors": connectors_label(version),
        "from": old,
        "to": new,
        "verdict": verdict,
        "exit_code": EXIT[verdict],
        "needs": [n.to_json() for n in needs],
        "regressions": [n.id for n in failing if n.status == "regression"],
        "missing_on_both": [n.id for n in failing if n.status == "missing on both"],
        "not_judged": unjudged,
    }


def markdown(rep: dict) -> str:
    lines = [
        f"# gate: {rep['client']} ({rep['connectors']}) on vLLM {rep['from']} -> {rep['to']}: **{rep['verdict']}**",
        "",
        "| need | on " + rep["from"] + " | on " + rep["to"] + " | evidence (candidate) |",
        "|---|---|---|---|",
    ]
    for n in rep["needs"]:
        mark = {True: "holds", False: "**fails**", None: "—"}
        lines.append(
            f"| {n['id']} | {mark[n['from']['holds'] if n['from'] else None]} | {mark[n['to']['holds']]} | "
            f"{n['to']['evidence']} |"
        )
    if rep["regressions"]:
        lines += ["", "Broken by the move: " + ", ".join(rep["regressions"])]
    if rep["missing_on_both"]:
        lines += ["", "Missing on both sides: " + ", ".join(rep["missing_on_both"])]
    if rep.get("not_judged"):
        lines += ["", "**Not judged statically:**", *[f"- {x}" for x in rep["not_judged"]]]
    return "\n".join(lines) + "\n"
