"""The env report: what the session observed, its selection, its timings, written at the end of the session
(`reports/<env>.{json,md}`), and SIGTERM handled like Ctrl-C so that an interrupted run says so."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.support.processes import children, owned_by_jobs, reap
from harness.testing.collector import COLLECTOR, E2E, META, NOTE, OBS, PROOF, STARTS, Collector
from harness.testing.recording import NA_PREFIX, observe_only

_STARTS_REPORTED = [0]


def report_generator_starts(report) -> None:
    """The generator start-ups of this process since the last test phase go with this phase's report, so the
    controlling process counts them also where pytest-xdist started them in a worker."""
    from harness.runtime.generator import START_SECONDS

    new = START_SECONDS[_STARTS_REPORTED[0] :]
    if new:
        report.user_properties.append((STARTS, [round(s, 2) for s in new]))
        _STARTS_REPORTED[0] = len(START_SECONDS)


def timings(col: Collector) -> dict:
    """Where the session's time went: the slowest tests, the shim proofs, the generator start-ups."""
    import statistics

    slowest = sorted(col.durations.items(), key=lambda kv: -kv[1])[:15]
    starts = list(col.starts)
    return {
        "session_s": round(time.time() - col.started, 1),
        "proofs_s": round(sum(v for k, v in col.durations.items() if "test_shim_proofs" in k), 1),
        "generator_starts": {
            "count": len(starts),
            "total_s": round(sum(starts), 1),
            "median_s": round(statistics.median(starts), 2) if starts else 0.0,
        },
        "slowest": [[k, round(v, 1)] for k, v in slowest],
    }


def tier(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "suites" else parts[0]


def pytest_runtest_logreport(report):
    """Runs in the controlling process for every phase of every test (xdist forwards reports)."""
    col = COLLECTOR
    t = col.tiers.setdefault(tier(report.nodeid), {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "wall_s": 0.0})
    t["wall_s"] += getattr(report, "duration", 0.0)
    col.durations[report.nodeid] = col.durations.get(report.nodeid, 0.0) + getattr(report, "duration", 0.0)
    for name, value in report.user_properties:
        if name == STARTS:  # attached to the phase that started them (harness.testing.plugin)
            col.starts.extend(value)
    # Properties are read once per test: from its call, or from its setup when the test never ran.
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _keep_properties(col, report.user_properties)
        _count_outcome(col, t, report)
    elif report.when == "teardown" and report.failed:
        col.tests["error"] += 1
        t["failed"] += 1


def _keep_properties(col: Collector, properties) -> None:
    """A test's observations, end-to-end rows, run metadata, notes and shim proofs, into the collector."""
    for name, value in properties:
        if name == OBS:
            col.observations[value["contract"]] = value
        elif name == E2E:
            col.e2e.append(value)
        elif name == META:
            col.meta = value
        elif name == NOTE and value not in col.notes:
            col.notes.append(value)
        elif name == PROOF:
            col.proofs[value["contract"]] = value


def _count_outcome(col: Collector, t: dict, report) -> None:
    """One test's outcome (a setup that did not pass is an error), and why it was skipped."""
    outcome = report.outcome if report.when == "call" or report.skipped else "error"
    if report.skipped:
        reason = skip_reason(report)
        col.skips.append({"test": report.nodeid, "reason": reason, "declared": reason.startswith(NA_PREFIX)})
    t["tests"] += 1
    col.tests[outcome] += 1
    t["failed" if outcome == "error" else outcome] += 1


def skip_reason(report) -> str:
    text = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return text[len("Skipped: ") :] if text.startswith("Skipped: ") else text


def pytest_configure(config):
    """SIGTERM ends the run the way Ctrl-C does: fixtures tear down (workers stop at once) and the report
    records the interruption. A second signal while tearing down kills what is left and exits. Also notes the
    suites' test files as they are now: what a complete run covers is decided when it starts."""
    if COLLECTOR.suite_files is None:
        COLLECTOR.suite_files = suite_files()
    if hasattr(config, "workerinput") or threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum, frame):
        if COLLECTOR.interrupted:
            reap([*children(), *owned_by_jobs()])
            os._exit(128 + signum)
        COLLECTOR.interrupted = signal.Signals(signum).name
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    signal.signal(signal.SIGTERM, on_term)


def pytest_keyboard_interrupt(excinfo):
    COLLECTOR.interrupted = COLLECTOR.interrupted or "SIGINT (KeyboardInterrupt)"


def pytest_deselected(items):
    COLLECTOR.deselected += len(items)


def pytest_collection_finish(session):
    COLLECTOR.collected = [item.nodeid for item in session.items]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under pytest-xdist the workers collect, not the controller: what they selected is the run's selection."""
    COLLECTOR.collected = list(ids)


def suite_files() -> dict[str, list[str]]:
    """The test files of each complete run (harness.support.paths.SUITES), relative to harness.support.paths.SUITES_BASE: a run that leaves any
    of them out is a subset."""
    from harness.support.paths import SUITES, SUITES_BASE

    return {
        kind: sorted(str(p.relative_to(SUITES_BASE)) for d in dirs for p in (SUITES_BASE / d).rglob("test_*.py"))
        for kind, dirs in SUITES.items()
    }


def selection(config, col: Collector) -> dict:
    """What this run selected, and in what way it is a subset of the complete run (`subset`: one line each)."""
    files = sorted({n.split("::")[0] for n in col.collected})
    kind = "gpu" if files and all(f.startswith("suites/gpu/") for f in files) else "cpu"
    full = (col.suite_files or suite_files())[kind]
    ran = sum(col.tests[k] for k in ("passed", "failed", "skipped", "error"))
    stopped = (
        f"stopped after {ran} of {len(col.collected)} selected tests"
        if ran < len(col.collected) and not col.interrupted
        else None
    )
    subset = _subset(config, col, kind, [f for f in full if f not in files])
    return {"kind": kind, "files": files, "tests": len(col.collected), "subset": subset, "stopped_early": stopped}


def _subset(config, col: Collector, kind: str, left_out: list[str]) -> list[str]:
    """Each way the run was narrowed: files left out, -k, -m (beyond the GPU suite's own), deselection, picks."""
    subset = []
    if left_out:
        subset.append("not run: " + ", ".join(left_out))
    if config.option.keyword:
        subset.append(f"-k {config.option.keyword!r}")
    if config.option.markexpr and not (kind == "gpu" and config.option.markexpr == "gpu"):
        subset.append(f"-m {config.option.markexpr!r}")
    from harness.testing.rows import from_options

    wanted = from_options(config)
    if wanted is not None:
        subset.append(f"narrowed to the tests observing {wanted.describe()}")
    if col.deselected:
        subset.append(f"{col.deselected} tests deselected")
    picked = [a for a in config.args if "::" in a]
    if picked:
        subset.append("single tests picked: " + ", ".join(a.split("/")[-1] for a in picked[:5]))
    return subset


def attach_proofs(rows: list[dict], proofs: dict[str, dict]) -> None:
    """Every contract row says what its shim's proof showed, that it did not run, or why none applies."""
    from harness import contracts
    from harness.reporting.report import PROOF_NA, PROOF_NOT_RUN

    wanted = contracts.proof_keys()
    for row in rows:
        key = row["contract"]
        if key in proofs:
            row["proof"] = {k: v for k, v in proofs[key].items() if k != "contract"}
        elif key in wanted:
            row["proof"] = {"result": PROOF_NOT_RUN, "evidence": "this run did not include its shim proof"}
        else:
            row["proof"] = {"result": PROOF_NA, "evidence": contracts.why_no_proof(key)}


def write_report(rep: dict, directory: Path) -> tuple[Path, Path]:
    """A partial run (a subset, interrupted, stopped early) never replaces the report of a complete run of the
    same env: it goes to <env>.incomplete.*. A complete run replaces both."""
    from harness.reporting.report import complete_run, write

    target = directory / f"{rep['env']}.json"
    if not rep["complete_run"] and target.is_file():
        try:
            previous = json.loads(target.read_text())
        except (OSError, ValueError):
            previous = {}
        if previous and complete_run(previous):
            return write(rep, directory, name=f"{rep['env']}.incomplete")
    for stale in (directory / f"{rep['env']}.incomplete.json", directory / f"{rep['env']}.incomplete.md"):
        if rep["complete_run"] and stale.is_file():
            stale.unlink()
    return write(rep, directory)


def _snapshot_versions(col: Collector) -> None:
    from harness.installed import versions

    try:
        col.meta = versions.snapshot()
    except Exception as e:  # noqa: BLE001 - the report must still be written
        col.notes.append(f"versions unknown: {e}")


def _stale_expectations(col: Collector) -> tuple[list[str], str | None]:
    """The expectations file for the observed vLLM and build, and its rows no contract defines (stale)."""
    from harness import contracts
    from harness.reporting import expectations as exp

    defined = set(contracts.keys()) | set(contracts.e2e_keys()) | set(contracts.native_keys())
    defined |= set(contracts.keys(contracts.model_types()))  # the GPU tier's rows (by model type): never stale
    if not col.meta:
        return [], None
    try:
        path, table = exp.load(col.meta["vllm"], col.meta["device_type"])
    except exp.NoExpectations as e:
        col.notes.append(str(e))
        return [], None
    return exp.stale(table, defined), path.name


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of session fixtures (generators closed)
def pytest_sessionfinish(session, exitstatus):
    from harness.runtime import zmq_contexts

    zmq_contexts.destroy_all()  # every engine is shut down by now; see the module for why
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes the report
        return
    col = COLLECTOR
    ran = {t for t, v in col.tiers.items() if v["tests"]} & {"contracts", "e2e", "bad_input", "native", "gpu"}
    if config.getoption("--harness-no-report") or not (ran or (col.interrupted and col.collected)):
        return
    if not col.meta:  # nothing observed (e.g. no generator started): still say which vLLM failed
        _snapshot_versions(col)
    from harness import contracts
    from harness.reporting.report import build

    stale, exp_file = _stale_expectations(col)
    tiers = {k: v for k, v in col.tiers.items() if v["tests"]}
    col.tests["wall_s"] = round(time.time() - col.started, 1)
    not_observed = sorted(set(contracts.keys()) - set(col.observations)) if "contracts" in tiers else []
    rows = list(col.observations.values())
    attach_proofs(rows, col.proofs)
    rep = build(
        config.getoption("--harness-env"),
        col.meta,
        rows,
        col.e2e,
        tiers,
        col.tests,
        stale,
        not_observed,
        exp_file,
        col.notes,
        selection=selection(config, col),
        skips=col.skips,
        interrupted=col.interrupted,
        timings=timings(col),
        observed_only=observe_only(),
    )
    col.last_report = rep
    j, m = write_report(rep, Path(config.getoption("--harness-report-dir")))
    drafted = j.with_name(f"{rep['env']}.expectations-draft.toml")
    if observe_only() and rep["contracts"]:
        from harness.reporting.expectations import draft
        from harness.reporting.report import publishable, write_atomic

        write_atomic(drafted, draft(publishable(rep)))  # the same text as the written report
        rep["draft"] = str(drafted)
    elif not observe_only():
        drafted.unlink(missing_ok=True)  # judged against reviewed expectations: an observation's draft is spent
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr:
        tr.write_line(f"harness: report written to {j} and {m} (status {rep['status']})")
        for g in rep["incomplete"]:
            tr.write_line(f"harness: incomplete: {g['what']}", yellow=True)
    if stale:
        if tr:
            tr.write_line(f"harness: STALE expectations (no such contract in this suite): {stale}", red=True)
        session.exitstatus = 1
