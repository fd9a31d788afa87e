"""Per-vLLM expectations: what each contract should show, with a one-line reason. Data only.

One TOML file per vLLM version and platform in `fixtures/expectations/` (`vllm-0.16.0-cpu.toml`).
Strict: an observed outcome that differs, a contract without an entry, and an entry for a contract
the suite does not have all fail the run. The file is found by the installed version; a version
without a file is an error that says which files exist (a nightly is not silently treated as the
release it follows). An entry may say whose fault a `broken` is where the reason alone would not:
`fault = "cpu-build"` (vLLM's CPU build cannot run the path; CUDA may: the matrix shows "not on the CPU build").
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.contracts.base import Outcome
from harness.support.paths import FIXTURES

OUTCOMES = {o.value for o in Outcome}


class NoExpectations(LookupError):
    pass


class BadExpectations(ValueError):
    """An expectations file that is not valid: one line naming the file, line and column."""


#: The faults an entry may name (see the module's docstring).
FAULTS = ("cpu-build",)


@dataclass(frozen=True)
class Expectation:
    key: str
    outcome: Outcome
    reason: str
    fault: str | None = None


def directory() -> Path:
    return Path(os.environ.get("HARNESS_EXPECTATIONS_DIR", FIXTURES / "expectations"))


def file_for(vllm_version: str, device_type: str, base: Path | None = None) -> Path:
    return (base or directory()) / f"vllm-{vllm_version}-{device_type}.toml"


def available(base: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (base or directory()).glob("vllm-*.toml"))


def _line_of(text: str, key: str) -> int:
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith((key + " ", key + "=", f'"{key}"')):
            return n
    return 0


#: Platform facts an entry may name as `on_<fact> = { outcome = ..., reason = ... }`: where this machine has the
#: fact, that outcome is expected instead (vLLM's CPU build takes another path on such a CPU).
FACTS = {"amx": "on CPUs with AMX"}


def platform_facts() -> dict[str, bool]:
    from harness.installed.versions import cpu

    return {"amx": cpu()["amx"]}


def _entry(entry, where: str) -> None:
    if not isinstance(entry, dict):
        raise BadExpectations(f"{where}: must be {{ outcome = ..., reason = ... }}")
    if entry.get("outcome") not in OUTCOMES:
        raise BadExpectations(f"{where}: outcome {entry.get('outcome')!r} is not one of {sorted(OUTCOMES)}")
    if not entry.get("reason"):
        raise BadExpectations(f"{where}: every expectation needs a reason")
    if entry.get("fault") is not None and (entry["fault"] not in FAULTS or entry.get("outcome") != "broken"):
        raise BadExpectations(
            f"{where}: fault {entry['fault']!r}: only a broken entry names one, one of {list(FAULTS)}"
        )


def load_file(path: Path, facts: dict[str, bool] | None = None) -> dict[str, Expectation]:
    """Parsed and validated; any defect raises BadExpectations with `file:line:column: what`. An entry's
    `on_<fact>` variant applies where `facts` (default: this machine's) has that fact."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BadExpectations(f"{path}: cannot be read: {e}") from None
    return load_text(text, path, facts)


def load_text(text: str, path: Path, facts: dict[str, bool] | None = None) -> dict[str, Expectation]:
    """`load_file` of a file's text (checked before it is written)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        import re

        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        where = f"{m.group(1)}:{m.group(2)}" if m else "?:?"
        raise BadExpectations(f"{path}:{where}: not valid TOML: {re.sub(r' *[(]at line.*$', '', str(e))}") from None
    contracts = data.get("contracts", {})
    if not isinstance(contracts, dict):
        raise BadExpectations(f"{path}:{_line_of(text, 'contracts')}:1: [contracts] must be a table")
    out = {}
    for key, entry in contracts.items():
        where = f"{path}:{_line_of(text, key)}:1: {key}"
        _entry(entry, where)
        chosen = entry
        for name, variant in entry.items():
            if not name.startswith("on_"):
                continue
            fact = name[3:]
            if fact not in FACTS:
                raise BadExpectations(
                    f"{where}: {name}: no such platform fact (known: " + ", ".join(f"on_{f}" for f in FACTS) + ")"
                )
            _entry(variant, f"{where}.{name}")
            if facts is None:
                facts = platform_facts()
            if facts.get(fact):
                chosen = {**variant, "reason": f"{FACTS[fact]}: {variant['reason']}"}
        out[key] = Expectation(key, Outcome(chosen["outcome"]), chosen["reason"], chosen.get("fault"))
    return out


def _shown(folder: Path) -> str:
    """A folder as messages (and the reports that quote them) show it: relative to the repo, else its name."""
    from harness.support.paths import REPO_ROOT

    folder = Path(folder).resolve()
    return str(folder.relative_to(REPO_ROOT)) if folder.is_relative_to(REPO_ROOT) else f"<{folder.name}>"


def load(vllm_version: str, device_type: str, base: Path | None = None) -> tuple[Path, dict[str, Expectation]]:
    path = file_for(vllm_version, device_type, base)
    if not path.is_file():
        have = ", ".join(available(base)) or "none"
        raise NoExpectations(
            f"no expectations for vLLM {vllm_version} on {device_type}: {path.name} does not exist in "
            f"{_shown(path.parent)} (have: {have}). Add one (see README, 'Adding a vLLM version') before trusting a run."
        )
    return path, load_file(path)


def stale(expected: dict[str, Expectation], defined: set[str]) -> list[str]:
    """Entries for contracts the suite does not define."""
    return sorted(set(expected) - defined)


def draft(report: dict) -> str:
    """A draft expectations file from what a run observed: to be reviewed line by line, not trusted. Written with
    tomli-w: every reason survives as it was observed (backslashes, quotes, newlines, any length)."""
    import tomli_w

    v = report["versions"]
    header = [
        f"# DRAFT, NOT REVIEWED: what speculators 0.3.0's contracts showed on vLLM {v['vllm']} "
        f"({v['vllm_distribution']}), {report['platform']['device_type']} build, in the run of "
        f"{report.get('generated_at', '?')} ({report.get('env', '?')}).",
        "# Review every line (is this the outcome this vLLM should show? is the reason true?), then save it as",
        f"# fixtures/expectations/vllm-{v['vllm']}-{report['platform']['device_type']}.toml and rerun.",
    ]
    reasons = (
        tomllib.loads((directory() / "reasons.toml").read_text()) if (directory() / "reasons.toml").is_file() else {}
    )
    rows: dict[str, dict] = {}
    for c in report["contracts"]:
        cid = c["contract"].split("[")[0]
        # a per-model row keeps what this run saw of that model: another family's one-line reason would not be its
        canned = None if "[" in c["contract"] else reasons.get(cid, {}).get(c["outcome"])
        reason = c.get("expected_reason") or canned or c["reason"]
        rows[c["contract"]] = {"outcome": c["outcome"], "reason": reason}
    failed = failed_e2e_rows(report)
    if failed:
        header += [
            f"# The e2e rows ({', '.join(failed)}) are end-to-end checks this run saw fail: a strict run fails",
            "# on them unless they are expected broken. Keep one only where the failure is this vLLM's (say why).",
        ]
    for key, why in failed.items():
        rows[key] = {"outcome": "broken", "reason": why}

    def value(x) -> str:  # a TOML value as tomli-w writes it (escapes included), for one inline row a contract
        return tomli_w.dumps({"x": x})[len("x = ") :].strip()

    def toml_key(k: str) -> str:
        return k if k.replace("_", "").replace("-", "").isalnum() else value(k)

    body = [
        f"vllm = {value(v['vllm'])}",
        f"platform = {value(report['platform']['device_type'])}",
        'speculators = "0.3.0"',
        "",
        "[contracts]",
    ]
    body += [
        f"{toml_key(k)} = {{ outcome = {value(r['outcome'])}, reason = {value(r['reason'])} }}" for k, r in rows.items()
    ]
    return "\n".join(header + body) + "\n"


def failed_e2e_rows(report: dict) -> dict[str, str]:
    """`e2e[<model or client row>]` -> what failed, for each end-to-end row the report saw fail (first check)."""
    out: dict[str, str] = {}
    for e in report.get("e2e", []):
        if e.get("result") == "fail":
            out.setdefault(f"e2e[{e['model']}]", f"{e['check']}: {e.get('measured', '')}".strip())
    return out
