"""No verdict greener than its evidence: how a run's status, its exit code and the matrix are judged."""

from __future__ import annotations

import json
import re

import pytest

from harness import contracts
from harness.commands import run as run_command
from harness.envs import tox_envs
from harness.reporting import matrix, report
from harness.support.paths import REPO_ROOT

SHIMMED_ROW = {
    "contract": "sched",
    "outcome": "shimmed",
    "expected": "shimmed",
    "shim": "s",
    "reason": "r",
    "unshimmed": {"ok": False, "error": "TypeError"},
    "proof": {"result": report.PROOF_NEEDED, "evidence": "without s: TypeError"},
}
FULL = {"kind": "cpu", "files": [], "tests": 3, "subset": [], "stopped_early": None}


def _rep(rows=(SHIMMED_ROW,), tests=None, **extra):
    args = dict(selection=FULL, skips=[], interrupted=None)
    args.update(extra)
    return report.build(
        "e",
        {"vllm": "0.16.0"},
        [dict(r) for r in rows],
        [],
        {},
        tests or {"passed": 3, "failed": 0, "skipped": 0, "error": 0},
        [],
        [],
        "f.toml",
        [],
        **args,
    )


def test_complete_observed_run_passes():
    rep = _rep()
    assert rep["status"] == "pass" and rep["incomplete"] == []


def test_a_subset_is_incomplete_and_says_what():
    rep = _rep(
        selection={**FULL, "subset": ["-k 'twophase'"]},
    )
    assert rep["status"] == "incomplete" and rep["incomplete"] == [{"kind": "subset", "what": "-k 'twophase'"}]


def test_not_observed_contracts_are_incomplete():
    rep = report.build(
        "e", {}, [SHIMMED_ROW], [], {}, {"failed": 0}, [], ["twophase"], "f", [], selection=FULL, skips=[]
    )
    assert rep["status"] == "incomplete" and "twophase" in rep["incomplete"][0]["what"]


def test_only_a_declared_na_skip_may_pass():
    declared = {"test": "t1", "reason": "n/a: no MLA", "declared": True}
    other = {"test": "t2", "reason": "needs a GPU", "declared": False}
    assert _rep(skips=[declared])["status"] == "pass"
    rep = _rep(skips=[declared, other])
    assert rep["status"] == "incomplete" and "t2 (needs a GPU)" in rep["incomplete"][0]["what"]


def test_a_shimmed_row_without_its_proof_is_incomplete():
    unproven = {k: v for k, v in SHIMMED_ROW.items() if k != "proof"}
    assert _rep([unproven])["status"] == "incomplete"
    not_run = {**SHIMMED_ROW, "proof": {"result": report.PROOF_NOT_RUN}}
    assert _rep([not_run])["incomplete"][0]["kind"] == "proof not run"


def test_interruption_is_recorded_and_incomplete():
    rep = _rep(interrupted="SIGTERM", tests={"passed": 1, "failed": 0, "skipped": 0, "error": 0})
    assert rep["status"] == "incomplete" and "interrupted (SIGTERM) after 1 of 3" in rep["incomplete"][0]["what"]


def test_failure_wins_over_everything():
    assert _rep(tests={"passed": 1, "failed": 1, "skipped": 0, "error": 0}, interrupted="SIGINT")["status"] == "fail"
    assert _rep([{**SHIMMED_ROW, "expected": "native"}])["status"] == "fail"


def test_a_report_from_before_selection_was_recorded_is_not_pass():
    """The committed matrix's reports predate these fields: judged again, they are incomplete, not pass."""
    old = {
        "status": "pass",
        "contracts": [{k: v for k, v in SHIMMED_ROW.items() if k != "proof"}],
        "tests": {"passed": 43, "failed": 0, "skipped": 18, "error": 0},
        "not_observed": [],
    }
    status, gaps = report.judge(old)
    assert status == "incomplete" and {g["kind"] for g in gaps} == {"unrecorded", "skipped", "proof not run"}


@pytest.mark.parametrize(
    "status,kinds,pytest_rc,want",
    [
        ("pass", [], 0, 0),
        ("fail", [], 1, 1),
        ("fail", [], 0, 1),
        ("incomplete", ["subset", "not observed"], 0, 0),  # the user asked for a subset
        ("incomplete", ["skipped"], 0, run_command.INCOMPLETE),
        ("incomplete", ["subset", "interrupted"], 2, run_command.INCOMPLETE),
        ("observed", ["failed"], 1, run_command.OBSERVED),
        ("observed", ["interrupted"], 2, run_command.INCOMPLETE),  # cut short
    ],
)
def test_exit_code(status, kinds, pytest_rc, want):
    rep = {"status": status, "incomplete": [{"kind": k, "what": k} for k in kinds]}
    assert run_command.exit_code(pytest_rc, rep) == want


def test_incomplete_run_never_replaces_a_complete_report(tmp_path):
    from harness.testing.session_report import write_report

    report.write(_rep(), tmp_path)
    partial = _rep(interrupted="SIGINT")
    j, _ = write_report(partial, tmp_path)
    assert j.name == "e.incomplete.json"
    assert json.loads((tmp_path / "e.json").read_text())["status"] == "pass"
    j, _ = write_report(_rep(), tmp_path)  # a later complete run replaces both
    assert j.name == "e.json" and not (tmp_path / "e.incomplete.json").exists()


def test_a_failing_subset_does_not_count_as_a_complete_run(tmp_path):
    from harness.testing.session_report import write_report

    report.write(_rep(selection={**FULL, "subset": ["-k x"]}, tests={"passed": 0, "failed": 1}), tmp_path)
    j, _ = write_report(_rep(selection={**FULL, "subset": ["-k y"]}), tmp_path)
    assert j.name == "e.json", "a partial run may replace another partial run, whatever its status"


def test_matrix_shows_incomplete_and_unproven_cells(tmp_path):
    env = next(iter(tox_envs.versions().values()))["env"]
    rep = _rep([{k: v for k, v in SHIMMED_ROW.items() if k != "proof"}])
    rep.update(e2e=[], generated_at="t")
    (tmp_path / f"{env}.json").write_text(json.dumps(rep))
    m = matrix.merge(tmp_path)
    assert m["columns"][0]["status"] == "incomplete"
    md = matrix.to_markdown(m)
    assert "*incomplete*" in md and f"shimmed{matrix.PROOF_MARK}" in md and "shim proofs not run for: sched" in md


def test_proofs_cover_every_contract_with_a_shim():
    """The proof list is derived from the contracts (C-import, once missing from a hand-kept list, included)."""
    ids = contracts.proof_ids()
    assert "import" in ids and "mla" in ids
    assert set(ids) == {m.CONTRACT.id for m in contracts.modules() if m.CONTRACT.shim}
    keys = contracts.proof_keys()
    assert "embed[tiny-kimi-k25]" in keys and "import" in keys and not any(k.startswith("layer") for k in keys)


@pytest.mark.parametrize("module", contracts.modules(), ids=lambda m: m.CONTRACT.id)
def test_every_shim_reference_resolves(module):
    """Each shim is a function object whose printed name (in reports and the gate) leads back to it."""
    from harness.contracts.base import resolve

    for shim in module.CONTRACT.shims:
        assert callable(shim.fn) and resolve(shim.name.split(" ")[0]) is shim.fn, shim.name


def test_committed_reports_hold_no_machine_paths():
    """Machine paths say nothing to the next reader: the repo root, site directories, the GPU machine's
    install target and output folders are dropped before a report is written (a vLLM temp file name that a
    connector returned is evidence and stays)."""
    machine = re.compile(
        r"/work/|/home/|/tmp/site/|/root/|/opt/torch|/usr/lib/python|/tmp/harness-models/|site-packages/"
    )
    hits = [
        f"{p.name}: {m.group(0)}"
        for p in (REPO_ROOT / "reports").rglob("*")
        if p.suffix in (".json", ".md")
        for m in [machine.search(p.read_text())]
        if m
    ]
    assert not hits, hits


def test_committed_reports_hold_no_object_addresses():
    hits = [
        p.name
        for p in (REPO_ROOT / "reports").rglob("*")
        if p.suffix in (".json", ".md", ".html") and "object at 0x" in p.read_text()
    ]
    assert not hits, f"object reprs with memory addresses in {hits}"


def test_attribution_names_whose_fault_a_broken_cell_is(monkeypatch):
    from harness.contracts.base import Attempt
    from harness.reporting.attribution import AGREE, Verdict

    monkeypatch.delenv("VLLM_MLA_DISABLE", raising=False)
    wrong = Verdict(Attempt(True), 1.28)
    assert wrong.vllm_wrong and wrong.says("DeepseekV3ForCausalLM").startswith(
        "vLLM CPU build computes DeepseekV3ForCausalLM wrongly: plain vLLM (no speculators) differs"
    )
    ours = Verdict(Attempt(True), AGREE / 10)
    assert not ours.vllm_wrong and "the harness's shim path is at fault" in ours.says("X")
    dead = Verdict(Attempt.failed("RuntimeError", "Engine core initialization failed"))
    assert dead.vllm_wrong and "does not start X either" in dead.says("X")
    from harness.subjects.models import TEXT_ONLY_REFUSAL

    ours_fixture = Verdict(Attempt.failed("RuntimeError", f"NotImplementedError: {TEXT_ONLY_REFUSAL}"))
    assert not ours_fixture.vllm_wrong and "the harness's tiny fixture is at fault" in ours_fixture.says("X")
    monkeypatch.setenv("VLLM_MLA_DISABLE", "1")
    assert wrong.says("X").endswith("(run with VLLM_MLA_DISABLE=1: this build cannot run MLA)")


def test_a_run_on_a_vllm_without_expectations_is_observed_never_pass_nor_fail():
    """Observe mode: rows carry no expectation (all 'unexpected'), a test may fail; the verdict is `observed`,
    exit 4, with the failures listed, and the matrix judges the report the same way."""
    row = {k: v for k, v in SHIMMED_ROW.items() if k != "expected"}
    clean = _rep(rows=(row,), observed_only=True)
    assert clean["status"] == "observed" and clean["unexpected"] == ["sched"]
    failing = _rep(rows=(row,), observed_only=True, tests={"passed": 2, "failed": 1, "skipped": 0, "error": 0})
    assert (
        failing["status"] == "observed"
        and {"kind": "failed", "what": "1 tests failed (not held to expectations: read each one)"}
        in failing["incomplete"]
    )
    assert run_command.exit_code(0, clean) == run_command.OBSERVED == 4
    assert report.judge(json.loads(json.dumps(failing)))[0] == "observed"
    held = _rep(rows=(row,))
    assert held["status"] == "fail", "held to expectations, an unexpected row still fails"


def test_flop_model_counts_a_checkpoint_by_its_headers_as_the_layout_says(tmp_path):
    """harness.gpu.flops counts a real checkpoint from its safetensors headers: on the generated tiny Llama and
    Kimi-K2.5 that equals the count from the harness's own weight layout; a packed int4 weight counts its
    unpacked values, quantization scales count nothing, routed experts count top-k of n."""
    import json

    from harness.gpu import flops
    from harness.subjects import models

    for name in ("tiny-llama", "tiny-kimi-k25"):
        m = models.build(name)
        layout = [(n, tuple(s), "BF16") for n, s, _ in models.weight_layout(models.load_fixture(name))]
        assert flops.checkpoint_flop_model(m.path) == flops.flop_model(m.hf_config, layout), name
    cfg = {
        "num_attention_heads": 2,
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "quantization_config": {"config_groups": {"g": {"weights": {"num_bits": 4}}}},
    }
    tensors = [
        ("model.layers.0.mlp.experts.0.up.weight_packed", (8, 1), "I32"),
        ("model.layers.0.mlp.experts.0.up.weight_scale", (8, 1), "BF16"),
        ("model.layers.0.self_attn.q.weight", (8, 8), "BF16"),
        ("lm_head.weight", (10, 8), "BF16"),
    ]
    fm = flops.flop_model(json.loads(json.dumps(cfg)), tensors)
    assert fm["params_active_per_token"] == 64 + 8 * 8 * 2 // 4 and fm["params_lm_head"] == 80
    assert flops.call_flops(fm, [3]) == 2 * fm["params_active_per_token"] * 3 + 1 * 2 * 9 * 2 * 8 / 2 + 2 * 80


def test_unpaired_timing_gives_the_ratio_of_medians_and_the_extreme_pairings():
    """Sides timed one after the other (engines that do not fit together): `paired`'s shape, the ratio of the
    medians, min and max from the slowest and fastest calls of each side; `timed` runs its warm-up untimed."""
    from harness.scenarios import bench

    r = bench.unpaired([2.0, 4.0, 3.0], [1.0, 2.0, 4.0])
    assert r["ratio"]["median"] == 3.0 / 2.0 and r["ratio"]["min"] == 2.0 / 4.0 and r["ratio"]["max"] == 4.0 / 1.0
    assert r["plain_s"]["median"] == 3.0 and r["extract_s"]["all"] == [1.0, 2.0, 4.0] and r["pairs"] == 3
    calls = []
    assert len(bench.timed(lambda: calls.append(1), 4, warmup=2)) == 4 and len(calls) == 6


def test_a_plain_vllm_child_killed_by_a_signal_is_named_with_its_place():
    """A child that dies by a signal without an error of its own (SIGABRT, as vLLM 0.16's CPU build now and then
    does) is reported by the signal's name and where Python's fault handler saw it, not as a bare exit code."""
    import subprocess
    import sys

    from harness.reporting.attribution import killed

    code = "import os\n\ndef deep():\n    os.abort()\n\ndeep()\n"
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True)
    assert proc.returncode < 0
    said = killed(proc.returncode, proc.stderr, tries=3)
    assert said.startswith('killed by SIGABRT (3 tries); last at: File "<string>", line 4 in deep'), said
    assert killed(2, "", tries=1) == "exit 2"


def test_a_row_not_observed_is_broken_and_says_what_stopped_it_never_a_cause_it_does_not_know():
    from harness.contracts import by_id
    from harness.contracts.base import NOT_OBSERVED, Attempt, Observation, Outcome

    contract = by_id()["forward"].CONTRACT
    obs = Observation(contract, Attempt.failed(NOT_OBSERVED, "the generator did not start, see layer[tiny-x]"))
    assert obs.outcome is Outcome.BROKEN
    assert obs.reason == "not observed: the generator did not start, see layer[tiny-x]"
    assert contract.broken_says not in obs.reason
