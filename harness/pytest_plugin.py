"""The suites' pytest plugin: environment defaults, observation recording, leak checks, the env report.

Tests attach what they observed to their report (`user_properties`), so the report is assembled in
the controlling process whether or not pytest-xdist runs the tests elsewhere. At the end of the
session the plugin checks the expectations for staleness and writes `reports/<env>.{json,md}`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.paths import REPORTS
from harness.processes import SESSION_PROCESSES, children, reap

# Offline and small: no hub lookups, a 1 GiB KV cache on CPU (vLLM would otherwise reserve half the RAM),
# and idle workers that sleep instead of spinning on their message queue (several shared generators
# wait idle while one works: spinning ones take the CPU it needs). Workers are spawned, never forked:
# a forked worker cannot use CUDA once the driver has touched it (seen on the H200 with vLLM 0.20).
for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_SLEEP_WHEN_IDLE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
               "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(_k, _v)

OBS, E2E, META, NOTE, PROOF = "harness.observation", "harness.e2e", "harness.meta", "harness.note", "harness.proof"
#: A skip whose reason starts with this is a declared n/a (the thing tested does not apply here, said why);
#: any other skip leaves the run incomplete.
NA_PREFIX = "n/a: "


def not_applicable(reason: str):
    """Skip a test because what it checks does not apply here (declared; the run can still pass)."""
    pytest.skip(NA_PREFIX + reason)


def pytest_addoption(parser):
    g = parser.getgroup("harness")
    g.addoption("--harness-env", default=os.environ.get("HARNESS_ENV", "local"), help="env name for reports/<env>.json")
    g.addoption("--harness-report-dir", default=str(REPORTS), help="where the env report goes")
    g.addoption("--harness-no-report", action="store_true", help="do not write reports/<env>.*")
    gpu = parser.getgroup("harness GPU tier (-m gpu)")
    gpu.addoption("--model-path", help="checkpoint folder (env HARNESS_GPU_MODEL_PATH)")
    gpu.addoption("--tp", type=int, help="tensor_parallel_size (env HARNESS_GPU_TP, default 8)")
    gpu.addoption("--layer-ids", help="comma-separated layer ids (env HARNESS_GPU_LAYER_IDS; default: speculators' choice)")
    gpu.addoption("--dtype", help="bfloat16 | float16 | float32 (env HARNESS_GPU_DTYPE, default bfloat16)")
    gpu.addoption("--prompts", help="prompt set JSON (env HARNESS_GPU_PROMPTS; default fixtures/prompts/gpu-prompts.json)")
    gpu.addoption("--gpu-report-dir", help="where the dated report goes (env HARNESS_GPU_REPORT_DIR; default reports/gpu)")
    gpu.addoption("--attention-backend", help="e.g. TRITON_MLA (env HARNESS_GPU_ATTENTION_BACKEND; default vLLM's)")
    gpu.addoption("--gpu-memory-utilization", type=float, help="(env HARNESS_GPU_MEMORY_UTILIZATION; default 0.8)")


# -- recording ------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def harness_meta() -> dict:
    from harness import versions

    return versions.snapshot()


def observe_only() -> bool:
    """HARNESS_OBSERVE=1 (set by `harness run` for a vLLM without an expectations file): record what it
    shows without holding it to expectations. The report's status is `observed`, never pass, and a draft
    expectations file is written beside it for review."""
    return os.environ.get("HARNESS_OBSERVE") == "1"


@pytest.fixture(scope="session")
def expectations(harness_meta):
    from harness import expectations as exp

    if observe_only():
        return {"path": "none (HARNESS_OBSERVE=1)", "table": {}}
    try:
        path, table = exp.load(harness_meta["vllm"], harness_meta["device_type"])
    except exp.BadExpectations as e:
        pytest.exit(f"harness: {e}", returncode=2)
    return {"path": str(path.name), "table": table}


@pytest.fixture
def record_observation(request, expectations, harness_meta):
    def record(obs) -> None:
        data = obs.to_json()
        exp = expectations["table"].get(obs.key)
        data["expected"] = str(exp.outcome) if exp else None
        data["expected_reason"] = exp.reason if exp else None
        data["expectations_file"] = expectations["path"]
        request.node.user_properties.append((OBS, data))
        request.node.user_properties.append((META, harness_meta))
    return record


@pytest.fixture
def record_e2e(request):
    def record(model: str, check: str, result: str, measured: str = "", **values) -> None:
        request.node.user_properties.append(
            (E2E, {"model": model, "check": check, "result": result, "measured": measured, **values}))
    return record


@pytest.fixture
def record_proof(request):
    """`record(key, result, text)`: a shim proof's result for contract row `key` (see harness.report.PROOF_*)."""
    def record(key: str, result: str, text: str = "") -> None:
        request.node.user_properties.append((PROOF, {"contract": key, "result": result, "evidence": text[:400]}))
    return record


@pytest.fixture
def record_note(request):
    def record(text: str) -> None:
        request.node.user_properties.append((NOTE, text))
    return record


def outcome_to_prove(key: str, expectations):
    """What a shim proof holds contract row `key` to: its expectation; where a build is observed without
    expectations, the outcome this run's probe of the row observed (None when the row was not observed)."""
    if not observe_only():
        return expectations["table"].get(key)
    from harness.contracts.base import Outcome
    from harness.expectations import Expectation

    data = _COLLECTOR.observations.get(key)
    if data is None:
        return None
    return Expectation(key, Outcome(data["outcome"]), f"observed by this run's probe: {data.get('reason', '')}")


def check_expected(obs, expectations) -> None:
    """Strict: the observed outcome must be the expected one, and an expectation must exist."""
    if observe_only():
        return
    exp = expectations["table"].get(obs.key)
    if exp is None:
        pytest.fail(f"{obs.key}: no expectation in {expectations['path']}; observed {obs.outcome} ({obs.reason})")
    assert obs.outcome == exp.outcome, (
        f"{obs.key}: expected {exp.outcome} ({exp.reason}); observed {obs.outcome}: {obs.reason}")
    selected = obs.facts.get("shim_selected")
    if isinstance(selected, bool):
        assert selected == (obs.outcome.value == "shimmed"), (
            f"{obs.key}: the harness's probing selects the shim={selected}, but the contract is {obs.outcome}")


# -- no worker outlives a test --------------------------------------------------------------------
@pytest.fixture(autouse=True)
def no_leftover_workers():
    """Fails a test that leaves a process it started alive (session-scoped generators excepted)."""
    before = set(children()) | SESSION_PROCESSES
    yield
    deadline = time.monotonic() + 15  # a shut-down executor's workers take a moment to exit
    left = {}
    while time.monotonic() < deadline:
        left = {pid: cmd for pid, cmd in children().items() if pid not in before and pid not in SESSION_PROCESSES}
        if not left:
            return
        time.sleep(0.5)
    reap(left)
    pytest.fail(f"processes started by this test are still alive after it: {left}")


# -- collecting and writing the env report ---------------------------------------------------------
class _Collector:
    def __init__(self):
        self.observations: dict[str, dict] = {}
        self.e2e: list[dict] = []
        self.meta: dict = {}
        self.notes: list[str] = []
        self.tiers: dict[str, dict] = {}
        self.tests = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
        self.started = time.time()
        self.proofs: dict[str, dict] = {}
        self.skips: list[dict] = []
        self.collected: list[str] = []
        self.deselected = 0
        self.interrupted: str | None = None
        self.durations: dict[str, float] = {}  # per test: setup + call + teardown


_COLLECTOR = _Collector()


def _timings(col: _Collector) -> dict:
    """Where the session's time went: the slowest tests, the shim proofs, the generator start-ups."""
    import statistics

    from harness.generator import START_SECONDS

    slowest = sorted(col.durations.items(), key=lambda kv: -kv[1])[:15]
    starts = list(START_SECONDS)
    return {"session_s": round(time.time() - col.started, 1),
            "proofs_s": round(sum(v for k, v in col.durations.items() if "test_shim_proofs" in k), 1),
            "generator_starts": {"count": len(starts), "total_s": round(sum(starts), 1),
                                 "median_s": round(statistics.median(starts), 2) if starts else 0.0},
            "slowest": [[k, round(v, 1)] for k, v in slowest]}


def _tier(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "suites" else parts[0]


def pytest_runtest_logreport(report):
    """Runs in the controlling process for every phase of every test (xdist forwards reports)."""
    col = _COLLECTOR
    t = col.tiers.setdefault(_tier(report.nodeid), {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "wall_s": 0.0})
    t["wall_s"] += getattr(report, "duration", 0.0)
    col.durations[report.nodeid] = col.durations.get(report.nodeid, 0.0) + getattr(report, "duration", 0.0)
    # Properties are read once per test: from its call, or from its setup when the test never ran.
    if report.when == "call" or (report.when == "setup" and not report.passed):
        for name, value in report.user_properties:
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
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = report.outcome if report.when == "call" or report.skipped else "error"
        if report.skipped:
            reason = _skip_reason(report)
            col.skips.append({"test": report.nodeid, "reason": reason, "declared": reason.startswith(NA_PREFIX)})
        t["tests"] += 1
        col.tests[outcome] += 1
        t["failed" if outcome == "error" else outcome] += 1
    elif report.when == "teardown" and report.failed:
        col.tests["error"] += 1
        t["failed"] += 1


def _skip_reason(report) -> str:
    text = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def pytest_configure(config):
    """SIGTERM ends the run the way Ctrl-C does: fixtures tear down (workers stop at once) and the report
    records the interruption. A second signal while tearing down kills what is left and exits."""
    if hasattr(config, "workerinput") or threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum, frame):
        if _COLLECTOR.interrupted:
            reap(children())
            os._exit(128 + signum)
        _COLLECTOR.interrupted = signal.Signals(signum).name
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    signal.signal(signal.SIGTERM, on_term)


def pytest_keyboard_interrupt(excinfo):
    _COLLECTOR.interrupted = _COLLECTOR.interrupted or "SIGINT (KeyboardInterrupt)"


def pytest_deselected(items):
    _COLLECTOR.deselected += len(items)


def pytest_collection_finish(session):
    _COLLECTOR.collected = [item.nodeid for item in session.items]


#: The suites a complete CPU run covers, and the GPU tier's; a run that leaves any of their test files out is a subset.
FULL_RUNS = {"cpu": ("suites/contracts", "suites/e2e", "suites/native", "suites/bad_input"), "gpu": ("suites/gpu",)}


def _selection(config, col: _Collector) -> dict:
    """What this run selected, and in what way it is a subset of the complete run (`subset`: one line each)."""
    from harness.paths import REPO_ROOT

    files = sorted({n.split("::")[0] for n in col.collected})
    kind = "gpu" if files and all(f.startswith("suites/gpu/") for f in files) else "cpu"
    full = sorted(str(p.relative_to(REPO_ROOT)) for d in FULL_RUNS[kind] for p in (REPO_ROOT / d).rglob("test_*.py"))
    subset = []
    left_out = [f for f in full if f not in files]
    if left_out:
        subset.append("not run: " + ", ".join(left_out))
    if config.option.keyword:
        subset.append(f"-k {config.option.keyword!r}")
    if config.option.markexpr and not (kind == "gpu" and config.option.markexpr == "gpu"):
        subset.append(f"-m {config.option.markexpr!r}")
    if col.deselected:
        subset.append(f"{col.deselected} tests deselected")
    picked = [a for a in config.args if "::" in a]
    if picked:
        subset.append("single tests picked: " + ", ".join(a.split("/")[-1] for a in picked[:5]))
    ran = sum(col.tests[k] for k in ("passed", "failed", "skipped", "error"))
    stopped = (f"stopped after {ran} of {len(col.collected)} selected tests"
               if ran < len(col.collected) and not col.interrupted else None)
    return {"kind": kind, "files": files, "tests": len(col.collected), "subset": subset, "stopped_early": stopped}


def _attach_proofs(rows: list[dict], proofs: dict[str, dict]) -> None:
    """Every contract row says what its shim's proof showed, that it did not run, or why none applies."""
    from harness import contracts
    from harness.report import PROOF_NA, PROOF_NOT_RUN

    wanted = contracts.proof_keys()
    for row in rows:
        key = row["contract"]
        if key in proofs:
            row["proof"] = {k: v for k, v in proofs[key].items() if k != "contract"}
        elif key in wanted:
            row["proof"] = {"result": PROOF_NOT_RUN, "evidence": "this run did not include its shim proof"}
        else:
            row["proof"] = {"result": PROOF_NA, "evidence": contracts.why_no_proof(key)}


#: The last report this process wrote (the CLI reads its status for the exit code).
LAST_REPORT: dict | None = None


def _write_report(rep: dict, directory: Path) -> tuple[Path, Path]:
    """A partial run (a subset, interrupted, stopped early) never replaces the report of a complete run of the
    same env: it goes to <env>.incomplete.*. A complete run replaces both."""
    from harness.report import complete_run, write

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


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of session fixtures (generators closed)
def pytest_sessionfinish(session, exitstatus):
    from harness import zmq_contexts

    zmq_contexts.destroy_all()  # every engine is shut down by now; see the module for why
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes the report
        return
    col = _COLLECTOR
    ran = {t for t, v in col.tiers.items() if v["tests"]} & {"contracts", "e2e", "bad_input", "native", "gpu"}
    if config.getoption("--harness-no-report") or not (ran or (col.interrupted and col.collected)):
        return
    if not col.meta:  # nothing observed (e.g. no generator started): still say which vLLM failed
        from harness import versions

        try:
            col.meta = versions.snapshot()
        except Exception as e:  # noqa: BLE001 - the report must still be written
            col.notes.append(f"versions unknown: {e}")
    from harness import contracts, expectations as exp
    from harness.models import load_fixture
    from harness.report import build

    families = [load_fixture(m)["family"] for m in contracts.E2E_MODELS]
    defined = set(contracts.keys(families)) | set(contracts.e2e_keys()) | set(contracts.native_keys())
    stale, exp_file = [], None
    if col.meta:
        try:
            path, table = exp.load(col.meta["vllm"], col.meta["device_type"])
            exp_file, stale = path.name, exp.stale(table, defined)
        except exp.NoExpectations as e:
            col.notes.append(str(e))
    tiers = {k: v for k, v in col.tiers.items() if v["tests"]}
    col.tests["wall_s"] = round(time.time() - col.started, 1)
    not_observed = sorted(set(contracts.keys(families)) - set(col.observations)) if "contracts" in tiers else []
    rows = list(col.observations.values())
    _attach_proofs(rows, col.proofs)
    rep = build(config.getoption("--harness-env"), col.meta, rows, col.e2e, tiers, col.tests, stale, not_observed,
                exp_file, col.notes, selection=_selection(config, col), skips=col.skips, interrupted=col.interrupted,
                timings=_timings(col), observed_only=observe_only())
    global LAST_REPORT
    LAST_REPORT = rep
    j, m = _write_report(rep, Path(config.getoption("--harness-report-dir")))
    if observe_only() and rep["contracts"]:
        from harness.expectations import draft
        from harness.report import write_atomic

        drafted = j.with_name(f"{rep['env']}.expectations-draft.toml")
        write_atomic(drafted, draft(rep))
        rep["draft"] = str(drafted)
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr:
        tr.write_line(f"harness: report written to {j} and {m} (status {rep['status']})")
        for g in rep["incomplete"]:
            tr.write_line(f"harness: incomplete: {g['what']}", yellow=True)
    if stale:
        if tr:
            tr.write_line(f"harness: STALE expectations (no such contract in this suite): {stale}", red=True)
        session.exitstatus = 1


def gpu_config(config):
    """The GPU tier's configuration: command-line options over HARNESS_GPU_* variables."""
    from harness.gpu_tier import TierConfig

    layer_ids = config.getoption("--layer-ids")
    return TierConfig.from_env(
        model_path=config.getoption("--model-path"), tp=config.getoption("--tp"),
        layer_ids=[int(x) for x in layer_ids.split(",")] if layer_ids else None, dtype=config.getoption("--dtype"),
        prompts_file=config.getoption("--prompts"), report_dir=config.getoption("--gpu-report-dir"),
        attention_backend=config.getoption("--attention-backend"),
        gpu_memory_utilization=config.getoption("--gpu-memory-utilization"))


def gpus_on_this_host() -> int:
    """CUDA devices torch sees here (0 without CUDA)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable torch: no GPUs
        return 0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`multi_gpu(n)` acts: a test that needs more GPUs of one host than this one has is skipped with that
    reason (a gap that makes the run incomplete, never a pass), before it starts anything."""
    needs = [(item, int(m.args[0])) for item in items for m in [item.get_closest_marker("multi_gpu")] if m]
    if not needs:
        return
    have = gpus_on_this_host()
    for item, n in needs:
        if n > have:
            item.add_marker(pytest.mark.skip(reason=f"needs {n} GPUs of one host, this host has {have}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A GPU run that was asked for (a model path given) may skip only for the documented reasons."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or item.get_closest_marker("gpu") is None:
        return
    from harness.gpu_tier import ALLOWED_SKIPS

    if not gpu_config(item.config).model_path:
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(allowed in reason for allowed in ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"the GPU tier was asked for (model path given) but skipped for another reason: {reason}"


@pytest.fixture
def numerics_expected(expectations):
    """`check(model, ok, measured)` for a comparison with transformers: it must hold, unless the expectations
    say this vLLM computes wrong numbers for the model (e2e[model] = broken); then it must still fail (strict:
    an unexpected pass fails, as everywhere else)."""
    def check(model: str, ok: bool, measured: str) -> None:
        exp = expectations["table"].get(f"e2e[{model}]")
        if observe_only() or exp is None or exp.outcome.value != "broken":
            assert ok, measured
            return
        assert not ok, f"e2e[{model}] is expected broken ({exp.reason}) but the numbers now match: {measured}"
    return check


def expected_broken(expectations, model: str) -> bool:
    exp = expectations["table"].get(f"e2e[{model}]")
    return exp is not None and exp.outcome.value == "broken" and not observe_only()
