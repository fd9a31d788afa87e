"""The matrix's client axis: one verdict per (speculators release, vLLM build), from what the report observed."""

from __future__ import annotations

from harness.reporting import client_axis as ca
from harness.subjects.releases import client_row


def _rep(contracts=(), e2e=()) -> dict:
    return {"contracts": [{"contract": k, "outcome": o, "expected": o} for k, o in contracts], "e2e": list(e2e)}


def _e2e(model, check, result, measured=""):
    return {"model": model, "check": check, "result": result, "measured": measured}


AGREES = "speculators 0.9.0 via vllm serve agrees with ours at the mapped ids"


def test_first_client_names_its_shims_and_never_counts_the_native_rows():
    rep = _rep(
        [
            ("sched", "shimmed"),
            ("embed[tiny-llama]", "shimmed"),
            ("import", "native"),
            ("native[tiny-llama]", "shimmed"),
        ]
    )
    cell = ca.cells(rep, "pass")["0.3.0"]
    assert cell["verdict"] == ca.SHIMMED and cell["shims"] == ["embed", "sched"]
    assert ca.cells(_rep([("import", "native")]), "pass")["0.3.0"]["verdict"] == ca.WORKS
    assert ca.cells(rep, "fail")["0.3.0"]["verdict"] == ca.BROKEN
    partial = ca.cells(rep, "incomplete")["0.3.0"]
    assert "[run incomplete]" in partial["why"] and not partial["complete"]
    assert ca._short(partial).endswith("(incomplete) (CPU)") and ca.label(partial).endswith("(run incomplete)")


def test_native_client_verdicts():
    ok = [
        _e2e(client_row(m), AGREES, "pass", "agrees (…; harness.native.sync_writer's connector (…))")
        for m in ("tiny-llama", "tiny-kimi-k25")
    ]
    cell = ca.cells(_rep(e2e=ok), "pass")["0.9.0"]
    assert cell["verdict"] == ca.SHIMMED and cell["shims"] == ["sync_writer"] and "tiny-kimi-k25" in cell["why"]
    gpu = [_e2e(client_row("tiny-llama"), AGREES, "pass", "agrees (…; vLLM's own connector)")]
    assert ca.cells(_rep(e2e=gpu), "pass")["0.9.0"]["verdict"] == ca.WORKS
    dead = [_e2e(client_row("tiny-llama"), AGREES, "fail", "the server path fails: vllm serve exited")]
    assert ca.cells(_rep(e2e=dead), "pass", "reports/vllm017.json")["0.9.0"] == {
        "verdict": ca.NOT_ON_CPU,
        "shims": [],
        "complete": True,
        "build": "cpu",
        "evidence": ["reports/vllm017.json"],
        "why": "tiny-llama: the server path fails: vllm serve exited",
        "fault": ca.CPU_BUILD_FAULT,
    }
    none = [_e2e(client_row("tiny-llama"), AGREES, "n/a", "no native hidden-state export in this vLLM")]
    assert ca.cells(_rep(e2e=none), "pass")["0.9.0"]["verdict"] == ca.NOT_RUNNABLE
    assert ca.cells(_rep(), "pass")["0.9.0"]["verdict"] == ca.NOT_OBSERVED


def test_second_client_outside_its_range_is_not_runnable_never_works():
    na = [_e2e("tiny-llama", ca.SECOND_CLIENT_CHECK, "n/a", "vLLM 0.20.0 is outside speculators 0.4.0's range")]
    assert ca.cells(_rep(e2e=na), "pass")["0.4.0"]["verdict"] == ca.NOT_RUNNABLE
    ok = [_e2e("tiny-llama", ca.SECOND_CLIENT_CHECK, "pass", "max abs diff 0")]
    assert ca.cells(_rep(e2e=ok), "pass")["0.4.0"]["verdict"] == ca.WORKS


def test_the_committed_matrix_has_every_client_for_every_build():
    from harness.reporting import matrix

    m = matrix.merge()
    assert set(m["clients"]) == set(ca.CLIENTS)
    versions = {c["version"] for c in m["columns"]}
    assert all(set(row) == versions for row in m["clients"].values())
    assert "Which speculators works with which vLLM" in matrix.to_markdown(m)


def test_a_build_without_the_export_is_not_runnable_for_every_server_client_even_before_its_rows():
    rep = _rep([("native-path", "n/a")])
    rep["contracts"][0]["reason"] = "no native hidden-state export in this vLLM"
    cells = ca.cells(rep, "pass")
    assert {cells[v]["verdict"] for v in ("0.5.0", "0.6.0", "0.8.0", "0.9.0")} == {ca.NOT_RUNNABLE}
    assert "native-path" in cells["0.5.0"]["why"]
    assert ca.cells(_rep([("native-path", "native")]), "pass")["0.5.0"]["verdict"] == ca.NOT_OBSERVED


def test_a_server_failure_is_broken_only_where_cuda_observed_it_and_a_client_failure_is_the_clients():
    dead = [_e2e(client_row("tiny-llama"), AGREES, "fail", "the server path fails: vllm serve exited")]
    cuda = _rep(e2e=dead)
    cuda["platform"] = {"device_type": "cuda"}
    cell = ca.cells(cuda, "pass")["0.9.0"]
    assert (cell["verdict"], cell["build"], cell["fault"]) == (ca.BROKEN, "cuda-sm90", "vLLM (server side)")
    lock = [_e2e(client_row("tiny-llama", "0.5.0"), AGREES, "fail", "the client fails: no lock protocol")]
    cell = ca.cells(_rep(e2e=lock), "pass")["0.5.0"]
    assert (cell["verdict"], cell["fault"]) == (ca.BROKEN, "speculators 0.5.0's client")
    assert ca._short(cell) == "**broken** (CPU)"


def test_the_cuda_cell_is_the_answer_and_the_cpu_cell_rides_along():
    cpu = ca._cell(ca.NOT_ON_CPU, "vllm serve exited", evidence=["reports/vllm020.json"], fault=ca.CPU_BUILD_FAULT)
    cuda = ca._cell(ca.WORKS, "agrees", build="cuda-sm90", evidence=["reports/gpu/x.json"])
    shown = ca.shown(cpu, cuda)
    assert shown["verdict"] == ca.WORKS and shown["cpu"]["verdict"] == ca.NOT_ON_CPU
    assert ca._short(shown) == "works (CUDA)" and ca.shown(cpu, None) is cpu
    assert ca.shown(None, None)["verdict"] == ca.NOT_OBSERVED


def test_cuda_cells_come_from_the_committed_gpu_reports():
    """vLLM 0.20's CUDA cells: the tier (speculators 0.3.0) and the four server-path clients, each naming files
    that exist."""
    from harness.reporting import builds
    from harness.support.paths import REPO_ROOT as ROOT
    from harness.support.paths import REPORTS

    cells = builds.cuda_cells(REPORTS, ca._cell)
    for release in ("0.3.0", "0.5.0", "0.6.0", "0.8.0", "0.9.0"):
        cell = cells[release]["0.20.0"]
        assert cell["build"] == builds.CUDA and cell["verdict"] in (ca.WORKS, ca.SHIMMED, ca.PARTIAL)
        assert cell["evidence"] and all((ROOT / e).is_file() for e in cell["evidence"])
    # The 0.20 Kimi report predates the rule that a missing last layer is no agreement: judged by today's rule.
    kimi = cells["0.9.0"]["0.20.0"]
    assert kimi["verdict"] == ca.PARTIAL and kimi["models"] == ["tiny-llama"] and kimi["fault"] == "vLLM (server side)"


def _tier_report(failed: str | None, **facts) -> dict:
    from harness.gpu.tier import ALONE_CHECK

    checks = [{"check": c, "result": "fail" if c == failed else "pass"} for c in ("same batch twice", ALONE_CHECK)]
    return {"checks": checks, **facts}


def test_a_tier_run_that_is_not_repeatable_blames_the_module_the_diagnosis_found():
    """Where the same batch twice differs, the fault is vLLM's, naming the module whose output changed on equal
    inputs (harness.gpu.module_determinism)."""
    from harness.reporting import builds

    rep = _tier_report(
        "same batch twice",
        nondeterministic_module={
            "culprit": {"module": "model.layers.1.mlp.experts", "class": "MoERunner", "max_abs_diff": 0.03}
        },
    )
    assert builds._tier_fault({"m": (None, rep)}) == (
        "vLLM: on m, MoERunner (model.layers.1.mlp.experts) differs on equal inputs"
    )


def test_a_prompt_that_changes_with_its_batch_is_blamed_on_vllm_with_the_layers_it_shows_in():
    """Where only alone vs in batch fails, vLLM's kernels' batch variance is named, with the largest difference at
    each captured layer in layer order; a failure the report cannot place is left to the report."""
    from harness.gpu.tier import ALONE_CHECK
    from harness.reporting import builds

    rep = _tier_report(ALONE_CHECK, alone_vs_batch_by_layer={"2": 7.7, "10": 9.0, "0": 0.25})
    assert builds._tier_fault({"m": (None, rep)}) == (
        "vLLM: on m, a prompt's states change with the rest of its "
        "batch (largest difference by captured layer: 0: 0.25, 2: 7.7, 10: 9)"
    )
    assert builds._tier_fault({"m": (None, _tier_report("same batch twice"))}) == "see the tier report"
    passing = _tier_report(None, alone_vs_batch_by_layer={"0": 0.0})
    assert builds._tier_fault({"m": (None, passing)}) == "see the tier report"


def test_the_committed_kimi_int4_report_gives_vllm_025_a_partial_cell_with_vllms_fault():
    """vLLM 0.25's CUDA cell for speculators 0.3.0 from the committed reports: the INT4 slice failed a check, so the
    cell is partial, its fault vLLM's, its evidence the slice's report."""
    from harness.reporting import builds
    from harness.support.paths import REPORTS

    cell = builds.cuda_cells(REPORTS, ca._cell)["0.3.0"]["0.25.0"]
    assert cell["verdict"] == ca.PARTIAL and "kimi-k25-int4-3l" not in cell["models"]
    assert cell["fault"].startswith("vLLM: on kimi-k25-int4-3l, ")
    assert any("kimi-k25-int4-3l" in e for e in cell["evidence"])
