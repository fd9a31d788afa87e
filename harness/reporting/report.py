"""Per-env reports: `reports/<env>.json` (schema in the README) and `reports/<env>.md`. Writes are atomic."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.reporting.report_markdown import markdown
from harness.support.paths import REPO_ROOT
from harness.support.report_files import now, write_atomic  # noqa: F401 - also this module's API
from harness.support.volatile import map_strings, text

SCHEMA = "harness-env-report/2"
#: Schema 1 keyed the per-model contract rows by architecture family (`embed[llama]`); schema 2 keys them by
#: tiny-model fixture (`embed[tiny-llama]`), so two fixtures of one architecture keep their own rows. The fixture
#: each family key of a schema-1 report was observed on (one fixture per family then):
FAMILY_KEYS_V1 = {"llama": "tiny-llama", "deepseek_v3": "tiny-deepseek-v3", "kimi_k25": "tiny-kimi-k25"}


def read(path: Path) -> dict:
    """An env report, upgraded to the current schema (the observations are unchanged; only row keys move)."""
    return upgrade(json.loads(Path(path).read_text()))


def upgrade(rep: dict) -> dict:
    if rep.get("schema") != "harness-env-report/1":
        return rep

    def key(k):
        if isinstance(k, str) and k.endswith("]") and "[" in k:
            cid, subject = k[:-1].split("[", 1)
            return f"{cid}[{FAMILY_KEYS_V1.get(subject, subject)}]"
        return k

    for c in rep.get("contracts", []):
        c["contract"] = key(c["contract"])
    for field in ("mismatched", "unexpected", "not_observed", "stale_expectations"):
        rep[field] = [
            dict(x, contract=key(x.get("contract"))) if isinstance(x, dict) else key(x) for x in rep.get(field) or []
        ]
    rep["schema"] = SCHEMA
    rep.setdefault("notes", []).append("read from schema harness-env-report/1: per-model rows re-keyed by fixture")
    return rep


#: A run's verdict. `pass`: every contract observed and as expected, every selected test passed, nothing skipped
#: but a declared n/a, every shim's proof recorded. `incomplete`: nothing failed, but something was not observed
#: (a subset ran, a skip, an interruption, a proof not run): `incomplete` lists what. `fail`: something did not
#: hold. A run is never greener than what it observed.
#: `observed`: a run on a vLLM with no expectations file, recorded without being held to anything; never
#: green, whatever it saw (its report says what it saw; its draft expectations await review).
STATUSES = ("pass", "incomplete", "fail", "observed")
OBSERVED = "observed"
#: Why a run is incomplete, by kind; only "subset" is what a user asks for (`run -- -k twophase`).
SUBSET = "subset"


def judge(rep: dict) -> tuple[str, list[dict]]:
    """The status of a report from its own content, and (for incomplete) what was not observed.

    Reports written before a field existed are judged by what they lack: no recorded selection, skips
    without reasons or rows without a proof result make them incomplete, never pass."""
    tests = rep.get("tests", {})
    failed = tests.get("failed", 0) + tests.get("error", 0)
    observed = rep.get("mode") == OBSERVED
    if not observed and (rep.get("mismatched") or rep.get("unexpected") or rep.get("stale_expectations") or failed):
        return "fail", []
    gaps = [{"kind": kind, "what": what} for kind, what in _gaps(rep, tests, failed if observed else 0)]
    if observed:
        return OBSERVED, gaps
    return ("incomplete" if gaps else "pass"), gaps


def _gaps(rep: dict, tests: dict, failed_observed: int):
    """(kind, what) for each thing the report did not observe, in the order a reader checks them: the run itself,
    the selection, the contracts, the skips, the shim proofs."""
    if failed_observed:
        yield "failed", f"{failed_observed} tests failed (not held to expectations: read each one)"
    if rep.get("interrupted"):
        ran = sum(tests.get(k, 0) for k in ("passed", "failed", "skipped", "error"))
        of = (rep.get("selection") or {}).get("tests")
        yield (
            "interrupted",
            (
                f"the run was interrupted ({rep['interrupted']}) after {ran}"
                + (f" of {of} selected tests" if of else " tests")
            ),
        )
    yield from _selection_gaps(rep.get("selection"))
    if rep.get("not_observed"):
        yield "not observed", "contracts not observed: " + ", ".join(rep["not_observed"])
    yield from _skip_gaps(rep.get("skips"), tests)
    unproven = [c["contract"] for c in rep.get("contracts", []) if _proof_missing(c)]
    if unproven:
        yield "proof not run", "shim proofs not run for: " + ", ".join(sorted(set(unproven)))


def _selection_gaps(selection: dict | None):
    if selection is None:
        yield "unrecorded", "the report does not record which tests were selected"
        return
    for what in selection.get("subset", []):
        yield SUBSET, what
    if selection.get("stopped_early"):
        yield "stopped", selection["stopped_early"]


def _skip_gaps(skips: list | None, tests: dict):
    if skips is None and tests.get("skipped"):
        yield "skipped", f"{tests['skipped']} tests skipped; the report does not record why"
    undeclared = [s for s in skips or [] if not s.get("declared")]
    if undeclared:
        yield (
            "skipped",
            (
                f"{len(undeclared)} tests skipped without a declared n/a: "
                + "; ".join(f"{s['test']} ({s['reason'][:80]})" for s in undeclared[:5])
            ),
        )


def _proof_missing(row: dict) -> bool:
    """A contract row whose shim proof did not run: marked so, or a shimmed row with no proof result at all."""
    proof = row.get("proof") or {}
    return proof.get("result") == PROOF_NOT_RUN or (row["outcome"] == "shimmed" and not proof.get("result"))


#: A contract row's `proof.result` (see suites/contracts/test_shim_proofs.py).
PROOF_NEEDED = "needed and sufficient"  # without the shim: the documented failure; with it: it works
PROOF_NOT_NEEDED = "not needed here"  # without the shim speculators works (the contract is native here)
PROOF_FAILED = "failed"  # the proof did not show what the expectations say
PROOF_NA = "n/a"  # no proof applies (no shim, or no working shim to prove); `why` says which
PROOF_NOT_RUN = "not run"  # the contract has a proof, but this run did not run it


def build(
    env: str,
    meta: dict,
    contracts: list[dict],
    e2e: list[dict],
    tiers: dict,
    tests: dict,
    stale: list[str],
    not_observed: list[str],
    expectations_file: str | None,
    notes: list[str],
    selection: dict | None = None,
    skips: list[dict] | None = None,
    interrupted: str | None = None,
    timings: dict | None = None,
    observed_only: bool = False,
) -> dict:
    mismatched = [c["contract"] for c in contracts if c.get("expected") and c["expected"] != c["outcome"]]
    unexpected = [c["contract"] for c in contracts if not c.get("expected")]
    rep = {
        "schema": SCHEMA,
        "env": env,
        "generated_at": now(),
        "status": None,
        "incomplete": [],
        "versions": {
            k: meta.get(k) for k in ("vllm", "vllm_distribution", "speculators", "torch", "transformers", "python")
        },
        "platform": {k: meta.get(k) for k in ("device_type", "machine", "cpus", "cpu", "runtime")},
        "build": meta.get("build"),
        "expectations_file": expectations_file,
        "contracts": sorted(contracts, key=lambda c: c["contract"]),
        "mismatched": mismatched,
        "unexpected": unexpected,
        "stale_expectations": stale,
        "not_observed": not_observed,
        "e2e": e2e,
        "tiers": tiers,
        "tests": tests,
        "selection": selection,
        "skips": skips or [],
        "interrupted": interrupted,
        "notes": notes,
        "timings": timings or {},
        "mode": OBSERVED if observed_only else "held to expectations",
    }
    rep["status"], rep["incomplete"] = judge(rep)
    rep["complete_run"] = complete_run(rep)
    return rep


def complete_run(rep: dict) -> bool:
    """Whether the whole run ran: nothing left out by selection, not interrupted, not stopped early (its
    verdict may still be fail or incomplete). Such a report is only ever replaced by another complete run."""
    sel = rep.get("selection")
    if sel is None:  # written before selections were recorded: complete if it passed or failed then
        return rep.get("status") in ("pass", "fail")
    return not (sel.get("subset") or sel.get("stopped_early") or rep.get("interrupted"))


#: An installed file's machine-specific prefix (".../site-packages/"), as Python's messages quote it.
SITE_PREFIX = re.compile(r"/[^\s'\"()]*?/site-packages/")


def unmachined_text(value: str) -> str:
    return SITE_PREFIX.sub("", value).replace(f"{REPO_ROOT}/", "")  # site-packages first: it may lie inside


def unmachined(value):
    """`value` with this machine's paths made relative (the checkout, site-packages): reports are committed and
    compared across machines."""
    return map_strings(value, unmachined_text)


def publishable(value):
    """What a written report holds: this machine's paths made relative, then volatile tokens (pids, log times, temp
    paths: harness.support.volatile.text) replaced, in one pass over the strings."""
    return map_strings(value, lambda v: text(unmachined_text(v)))


def write(rep: dict, directory: Path, name: str | None = None) -> tuple[Path, Path]:
    directory = Path(directory)
    name = name or rep["env"]
    j, m = directory / f"{name}.json", directory / f"{name}.md"
    rep = publishable(rep)
    write_atomic(j, json.dumps(rep, indent=2, sort_keys=False, default=str) + "\n")
    write_atomic(m, markdown(rep))
    return j, m
