"""A new tiny model's rows in every CPU expectations file, written from the runs that observed it.

A fixture adds ten rows per model to every `fixtures/expectations/vllm-*-cpu.toml` (the per-model contracts, the
native export's four, and `e2e[<model>]` where the model's end-to-end checks are expected to fail). Writing them by
hand invites copying another family's reasons. `python -m harness expectations --add-model NAME --from REPORT ...`
writes them from what the reports observed (`harness run --observe` on the new model):

* a build a report observed gets the rows as observed, each with the reason the run gave for this model;
* every other build gets PREDICTED rows from the nearest observed build (by release order), by one rule: a row the
  new model had broken stays broken (a break of the model's own persists until a run says otherwise); any other
  row moves as most tiny models' same rows moved between the two builds (the native export's rows go from n/a
  before 0.17 to what 0.17 shows), else it keeps its observed outcome. The reason says which, and quotes the
  observation it started from.

Completing a build (`HARNESS_RUN_ARGS=--complete tox -e vllmXYZ`) then observes the predicted rows; a mismatch fails
that run and the row is corrected from it.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from harness.reporting import expectations

CPU = "cpu"
PREDICTED = "PREDICTED"


class AddModelError(ValueError):
    """Bad input to --add-model: one line, nothing written."""


def model_row_ids() -> list[str]:
    from harness import contracts

    return [*contracts.PER_MODEL, *contracts.NATIVE_PER_MODEL]


def observed_rows(report: dict, name: str) -> dict[str, tuple[str, str]]:
    """key -> (outcome, reason) for every row of `name` the report observed, `e2e[name]` where a check failed."""
    rows = {
        c["contract"]: (c["outcome"], _short(c["reason"]))
        for c in report.get("contracts", [])
        if c["contract"].endswith(f"[{name}]") and c["contract"].split("[")[0] in model_row_ids()
    }
    failed = expectations.failed_e2e_rows(report).get(f"e2e[{name}]")
    if failed:
        rows[f"e2e[{name}]"] = ("broken", _short(failed))
    return rows


#: A row's reason quotes at most this much of an observation (the report holds the whole text).
REASON_CHARS = 240


def _short(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 2].rsplit(" ", 1)[0] + " …"


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]|post", version))


def cpu_files(base: Path | None = None) -> dict[str, Path]:
    """vLLM version -> its CPU expectations file."""
    folder = base or expectations.directory()
    return {p.name[len("vllm-") : -len("-cpu.toml")]: p for p in sorted(folder.glob(f"vllm-*-{CPU}.toml"))}


def predicted(
    observed: dict[str, tuple[str, str]],
    name: str,
    source: dict,
    target: dict,
    source_version: str,
    marks: tuple[bool | None, bool | None] = (None, None),
) -> dict[str, tuple[str, str]]:
    """The new model's rows for a build not observed, from its rows on the observed build (`source`/`target`: the
    two builds' parsed tables, other models' rows included; `marks`: whether the model's class carries
    SupportsEagle3 in the observed build's and this build's sources, harness.reporting.class_marks)."""
    from harness.reporting import class_marks

    out: dict[str, tuple[str, str]] = {}
    export_here = any(k.startswith("native-eagle3[") and e.outcome.value != "n/a" for k, e in target.items())
    for key, (outcome, reason) in observed.items():
        cid = key.split("[")[0]
        seen = f"observed on vLLM {source_version}: {outcome} ({_short(reason)})"
        by_mark = class_marks.predicted(cid, outcome, export_here, *marks)
        if by_mark is not None:
            out[key] = (by_mark[0], f"{PREDICTED}: {by_mark[1]}; {seen}")
            continue
        if outcome == "broken":
            out[key] = (
                "broken",
                f"{PREDICTED}: a break of this model's own persists until a run says otherwise; {seen}",
            )
            continue
        moved = Counter(
            target[k].outcome.value
            for k, e in source.items()
            if k.split("[")[0] == cid and not k.endswith(f"[{name}]") and e.outcome.value == outcome and k in target
        )
        majority = max(moved.items(), key=lambda kv: (kv[1], kv[0]))[0] if moved else None
        if majority is not None:
            how = f"stay {majority}" if majority == outcome else f"move from {outcome} to {majority}"
            out[key] = (majority, f"{PREDICTED}: as most tiny models' {cid} rows {how} here; {seen}")
        else:
            out[key] = (outcome, f"{PREDICTED}: no other model's row to follow, kept; {seen}")
    return out


def plan(
    name: str, reports: list[dict], base: Path | None = None, marked=None
) -> dict[Path, dict[str, tuple[str, str]]]:
    """Per CPU expectations file, the rows to write for `name`; `marked(version)`: whether its class carries
    SupportsEagle3 in that build (None: the marked rows are predicted like any other)."""
    files = cpu_files(base)
    seen: dict[str, dict] = {}
    for rep in reports:
        version = rep["versions"]["vllm"]
        if rep["platform"]["device_type"] != CPU or version not in files:
            raise AddModelError(
                f"--from: a report of vLLM {version} ({rep['platform']['device_type']}) has no CPU "
                "expectations file to write into"
            )
        rows = observed_rows(rep, name)
        if not rows:
            raise AddModelError(
                f"--from: the report of vLLM {version} observed no row of {name} "
                f"(run `harness run --observe -- --harness-only-models {name}` first)"
            )
        seen[version] = rows
    if not seen:
        raise AddModelError("--add-model needs at least one report that observed the model (--from)")
    tables = {v: expectations.load_file(p) for v, p in files.items()}
    order = sorted(files, key=_version_key)
    out: dict[Path, dict[str, tuple[str, str]]] = {}
    for version, path in files.items():
        if version in seen:
            out[path] = seen[version]
            continue
        nearest = min(seen, key=lambda v: (abs(order.index(v) - order.index(version)), order.index(v)))
        marks = (marked(nearest), marked(version)) if marked is not None else (None, None)
        out[path] = predicted(seen[nearest], name, tables[nearest], tables[version], nearest, marks)
    return out


def block(name: str, rows: dict[str, tuple[str, str]], header: str) -> str:
    import tomli_w

    def value(x: str) -> str:
        return tomli_w.dumps({"x": x})[len("x = ") :].strip()

    order = {cid: i for i, cid in enumerate([*model_row_ids(), "e2e"])}
    lines = [f"# {name}: {header}"]
    for key in sorted(rows, key=lambda k: order.get(k.split("[")[0], 99)):
        outcome, reason = rows[key]
        lines.append(f'"{key}" = {{ outcome = {value(outcome)}, reason = {value(reason)} }}')
    return "\n".join(lines) + "\n"


def rewritten(text: str, name: str, new_block: str) -> str:
    """The file's text without any earlier rows (or block comment) of `name`, the new block appended."""
    kept = [
        line
        for line in text.splitlines()
        if not line.startswith(f"# {name}: ") and not re.match(rf'^"[\w-]+\[{re.escape(name)}\]"\s*=', line)
    ]
    body = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).rstrip("\n")  # a block removed mid-file leaves no gap
    return body + "\n\n" + new_block


def write(
    name: str, reports: list[dict], header: str, base: Path | None = None, marked=None
) -> list[tuple[Path, int, int]]:
    """Write every file's rows (each file whole, checked to parse before it replaces the old one); per file
    (path, rows observed, rows predicted)."""
    planned = plan(name, reports, base, marked)
    texts = {}
    for path, rows in planned.items():
        text = rewritten(path.read_text(), name, block(name, rows, header))
        expectations.load_text(text, path)  # a defect refuses before anything is written
        texts[path] = text
    for path, text in texts.items():
        tmp = path.with_suffix(".toml.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return [
        (
            p,
            sum(not r[1].startswith(PREDICTED) for r in rows.values()),
            sum(r[1].startswith(PREDICTED) for r in rows.values()),
        )
        for p, rows in planned.items()
    ]
