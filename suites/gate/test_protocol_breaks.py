"""Breaks no signature shows: the model runner a worker builds, the order of a step's requests, EngineCore's set-up
steps, and the vLLM surface of the harness's own shims. Read from the real 0.32/0.33/0.34 sources the gate
downloads (cached), and from fabricated trees (0.32.0 with one thing changed) for each new check.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from harness.envs import sources
from harness.gate.cli import configure, run
from harness.gate.read import client
from harness.gate.sweeps import bisect
from harness.support.paths import REPO_ROOT


def _gate(tmp_path: Path, old: str, new: str, cache: Path | None = None) -> tuple[int, dict, str]:
    out, md = tmp_path / "gate.json", tmp_path / "gate.md"
    argv = ["--from", old, "--to", new, "--json", str(out), "--summary", str(md)]
    rc = run(configure(argparse.ArgumentParser()).parse_args(argv + (["--cache-dir", str(cache)] if cache else [])))
    return rc, json.loads(out.read_text()), md.read_text()


def _findings(rep: dict, contract: str, kind: str) -> list[dict]:
    return [f for f in rep["findings"] if f["contract"] == contract and f["kind"] == kind]


@pytest.mark.parametrize("old", ["0.32.0", "0.33.0"])
def test_0340_names_the_runner_removal_and_the_extensible_kv_cache_step_each_with_its_v2_shim(
    old, tmp_path, covered_then_review
):
    """0.34's breaks, each named with evidence and the shim that handles it (proved by reports/vllm034.*); a
    V2 runner that exposed no step order, or a set-up step no shim makes, stays uncovered (the fabricated trees)."""
    rc, rep, md = _gate(tmp_path, old, "0.34.0")
    assert covered_then_review(rc, rep), md
    replaced = _findings(rep, "chunkedprefill", "runner-replaced")
    assert {f["symbol"] for f in replaced} == {
        "vllm.v1.worker.gpu_worker:Worker.model_runner",
        "vllm.v1.worker.cpu_worker:CPUWorker.model_runner",
    }
    gpu = next(f for f in replaced if "gpu_worker" in f["symbol"])
    assert "gpu_model_runner.GPUModelRunner (keeps input_batch)" in gpu["old"]
    assert "v1.worker.gpu.model_runner.GPUModelRunner (builds each step's batch in prepare_inputs)" in gpu["new"]
    assert gpu["status"] == "covered" and gpu["shim"] == "harness.contracts.chunkedprefill.apply_worker"
    assert gpu["evidence"].startswith("vllm/v1/worker/gpu_worker.py:")
    # CUDA's V2 runner sorted a step's requests already on the baseline (its default since 0.22): carried, covered
    [order] = [f for f in rep["carried"] if f["kind"] == "step-order-sorted" and "gpu_worker" in f["symbol"]]
    assert order["evidence"].startswith("vllm/v1/worker/gpu/model_runner.py:") and order["status"] == "covered"
    assert order["shim"] == "harness.contracts.chunkedprefill.in_request_order"
    assert not _findings(rep, "chunkedprefill", "shim-surface-removed")  # nothing the shims read is gone
    steps = {f["symbol"].rsplit("executor.", 1)[1]: f for f in _findings(rep, "kvlayout", "extensible-kv-cache-step")}
    assert set(steps) == {"extend_kv_cache()", "extensible_kv_cache_unsupported_reason()"}, md
    assert steps["extend_kv_cache()"]["evidence"].startswith("vllm/v1/engine/core.py:")
    assert all(
        f["status"] == "covered" and f["shim"] == "harness.contracts.kvlayout.no_extensible_cache"
        for f in steps.values()
    )
    assert not _findings(rep, "kvlayout", "setup-step-skipped")  # disable_extensible_kv_cache: the shim makes it
    [twophase] = _findings(rep, "twophase", "two-phase-execute")
    assert "no State error guard" in twophase["new"] and "v1.worker.gpu.model_runner" in twophase["new"]
    assert rep["contracts"]["chunkedprefill"]["status"] == rep["contracts"]["kvlayout"]["status"] == "covered"
    assert "extend_kv_cache" in md and "no_extensible_cache" in md


def test_0320_to_0330_holds_the_runner_and_the_set_up_steps(tmp_path, covered_then_review):
    """The runners each platform builds by default are the same in 0.32 and 0.33 (CUDA: the V2 runner as well, on
    by default since 0.22 wherever Triton imports), their set-up steps the same."""
    rc, rep, md = _gate(tmp_path, "0.32.0", "0.33.0")
    assert covered_then_review(rc, rep), md
    assert not [f for f in rep["findings"] if f["contract"] in ("chunkedprefill", "kvlayout", "runtime")], md
    assert rep["contracts"]["chunkedprefill"]["status"] == "outside"
    # runner and step order for both workers
    assert rep["contracts"]["chunkedprefill"]["note"].startswith("5 static fact(s) unchanged")


@pytest.mark.parametrize("contract", ["chunkedprefill", "kvlayout"])
def test_bisect_names_0340_for_the_runner_and_the_set_up_step(contract):
    found = bisect.bisect(contract, "0.32.0", "0.34.0", log=lambda m: None)
    assert (found.first, found.last_without, found.undone_in) == ("0.34.0", "0.33.0", None), found.says()


def test_client_090_names_the_v2_speculator_where_cudas_runner_starts_serving_it(tmp_path):
    """The V2 runner is CUDA's default from 0.22; its own ExtractHiddenStatesSpeculator serves the export by 0.32
    (0.22's V2 package has none): UNDECIDED across that move, SAFE from 0.32 to 0.34 (the same class on both)."""
    old, new = sources.ensure("0.22.0").root, sources.ensure("0.32.0").root
    rep = client.report("0.9.0", "0.22.0", "0.32.0", client.check("0.9.0", old, new), client.not_judged(old, new))
    assert not rep["regressions"], rep["regressions"]
    assert (rep["verdict"], rep["exit_code"]) == ("UNDECIDED", 5)
    [why] = rep["not_judged"]
    assert "gpu/spec_decode/extract_hidden_states.py:ExtractHiddenStatesSpeculator" in why
    assert "spec_decode/extract_hidden_states.py:ExtractHiddenStatesProposer" in why
    old, new = sources.ensure("0.32.0").root, sources.ensure("0.34.0").root
    assert client.not_judged(old, new) == []


# -- fabricated builds: 0.32.0 with one change each ---------------------------------------------------------
@pytest.fixture
def fabricate(tmp_path):
    """(cache with 0.32.0, a copy of the 0.32.0 tree to change) -> gate it against 0.32.0."""
    cache = tmp_path / "cache"
    base = sources.ensure("0.32.0").root
    shutil.copytree(base, cache / "vllm-0.32.0")
    tree = tmp_path / "vllm-fab"
    shutil.copytree(base / "vllm", tree / "vllm")
    (tree / "vllm" / "_version.py").write_text("__version__ = version = '0.32.1.dev1'\n")

    def gate() -> tuple[int, dict, str]:
        return _gate(tmp_path, "0.32.0", str(tree), cache)

    return tree, gate


def test_a_deleted_module_a_shim_imports_by_name_is_a_finding_against_its_contract(fabricate):
    tree, gate = fabricate
    (tree / "vllm/v1/attention/backends/utils.py").unlink()  # where C-kvlayout's shim finds the layout resolver
    rc, rep, md = gate()
    [gone] = [
        f
        for f in _findings(rep, "kvlayout", "shim-surface-removed")
        if f["symbol"] == "vllm.v1.attention.backends.utils"
    ]
    assert gone["site"] == "harness/contracts/kvlayout.py:_resolver" and gone["new"] == "all gone"
    assert gone["status"] == "uncovered" and "shim no longer applies" in gone["reason"]
    assert rc == 1 and rep["contracts"]["kvlayout"]["status"] == "needs-new-shim", md


def test_a_new_engine_core_set_up_call_is_a_finding(fabricate):
    tree, gate = fabricate
    core = tree / "vllm/v1/engine/core.py"
    text = core.read_text()
    anchor = "        self.model_executor.initialize_from_config(kv_cache_configs)\n"
    assert anchor in text, "the 0.32.0 sources no longer hold the line this test extends"
    core.write_text(text.replace(anchor, anchor + "        self.model_executor.prime_kv_cache()\n", 1))
    rc, rep, md = gate()
    [step] = _findings(rep, "kvlayout", "setup-step-skipped")
    assert step["symbol"].endswith("executor.prime_kv_cache()") and step["status"] == "uncovered"
    assert step["evidence"].startswith("vllm/v1/engine/core.py:")
    assert rc == 1 and rep["verdict"] == "NEEDS-NEW-SHIM", md


def test_a_runner_that_exposes_no_step_order_is_a_finding(fabricate):
    """A runner with neither a persistent batch nor a step batch built in prepare_inputs: nothing tells the shim
    in which order a step's rows were captured."""
    tree, gate = fabricate
    runner = tree / "vllm/v1/worker/gpu_model_runner.py"
    text = runner.read_text()
    assert "self.input_batch = InputBatch(" in text, "the 0.32.0 sources no longer hold the line this test changes"
    assert "def prepare_inputs(" not in text  # V1 prepares its inputs privately
    runner.write_text(text.replace("self.input_batch = InputBatch(", "self.batch_state = InputBatch("))
    rc, rep, md = gate()
    [gpu] = [f for f in _findings(rep, "chunkedprefill", "runner-replaced") if "gpu_worker" in f["symbol"]]
    assert gpu["status"] == "uncovered" and "no shim reads its order" in gpu["reason"], md
    assert rc == 1 and rep["contracts"]["chunkedprefill"]["status"] == "needs-new-shim", md


# -- one step away from the shapes above: paths, not patterns ---------------------------------------------
SETUP_ANCHOR = "        self.model_executor.initialize_from_config(kv_cache_configs)\n"


@pytest.mark.parametrize(
    "how,insert,helper",
    [
        (
            "a helper of EngineCore",
            "        self._prime_caches()\n",
            "    def _prime_caches(self):\n        self.model_executor.prime_kv_cache()\n\n",
        ),
        ("EngineCore's collective_rpc wrapper", '        self.collective_rpc("prime_kv_cache")\n', ""),
        ("the executor, by name", '        self.model_executor.collective_rpc("prime_kv_cache")\n', ""),
    ],
)
def test_a_set_up_step_behind_a_helper_or_sent_by_name_is_a_finding(fabricate, how, insert, helper):
    tree, gate = fabricate
    core = tree / "vllm/v1/engine/core.py"
    text = core.read_text()
    assert SETUP_ANCHOR in text, "the 0.32.0 sources no longer hold the line this test extends"
    text = text.replace(SETUP_ANCHOR, SETUP_ANCHOR + insert, 1)
    if helper:
        anchor = "    def _initialize_kv_caches("
        text = text.replace(anchor, helper + anchor, 1)
    core.write_text(text)
    rc, rep, md = gate()
    [step] = _findings(rep, "kvlayout", "setup-step-skipped")
    assert step["symbol"].endswith("executor.prime_kv_cache()") and step["status"] == "uncovered", how
    assert rc == 1 and rep["verdict"] == "NEEDS-NEW-SHIM", md


def test_an_attribute_assigned_only_outside_construction_does_not_count(fabricate):
    """`self.input_batch = None` in a tear-down method says nothing about a running runner's batch."""
    tree, gate = fabricate
    runner = tree / "vllm/v1/worker/gpu_model_runner.py"
    text = runner.read_text()
    assert "self.input_batch = InputBatch(" in text
    anchor = "    def load_model("
    text = text.replace("self.input_batch = InputBatch(", "self.batch_state = InputBatch(")
    text = text.replace(anchor, "    def release_batches(self):\n        self.input_batch = None\n\n" + anchor, 1)
    runner.write_text(text)
    rc, rep, md = gate()
    [gpu] = [f for f in _findings(rep, "chunkedprefill", "runner-replaced") if "gpu_worker" in f["symbol"]]
    assert gpu["status"] == "uncovered", md
    assert rc == 1, md


def test_cuda_is_judged_by_the_runner_its_config_selects():
    """From 0.22 VllmConfig turns the V2 runner on wherever Triton imports (CUDA hosts): the gate counts it as a
    default there; up to 0.20 it is an opt-in variable."""
    from harness.vllm_source import runners

    for version, v2 in (("0.20.0", False), ("0.22.0", True), ("0.33.0", True)):
        root = sources.ensure(version).root
        assert runners.v2_by_default(root) is v2, version
        built = {r.path for r in runners.read(str(root), "vllm.v1.worker.gpu_worker").defaults}
        assert ("vllm.v1.worker.gpu.model_runner.GPUModelRunner" in built) is v2, (version, built)


def test_a_sort_moved_from_the_runner_into_the_scheduler_is_never_safe(tmp_path):
    """0.34: the V2 runner's sort of a step's requests removed and put into Scheduler.schedule."""
    from harness.gate.sweeps import mutants

    root = sources.ensure("0.34.0").root
    found, _ = mutants.generate("0.34.0", root, per_operator=5)
    [moved, *_] = [m for m in found if m.operator == "move-sort"]
    judged = mutants.judge(str(root), str(REPO_ROOT / "fixtures/surfaces/speculators-0.3.0.json"), moved)
    assert judged.verdict not in ("SAFE", "ERROR"), judged
    assert "Scheduler.schedule" in judged.reason or "step-order" in judged.reason, judged.reason


def test_the_quick_mutation_run_flags_every_protocol_mutant_and_no_neutral_one(tmp_path):
    """The CI subset of `harness gate mutants`: one mutant per operator of 0.34.0 (the full run, 15 per operator
    on 0.33.0 and 0.34.0, is reports/gate-mutants.*)."""
    from harness.gate.sweeps import mutants

    rep = mutants.run(["0.34.0"], 1, tmp_path / "m.json", tmp_path / "m.md", log=lambda m: None)
    assert rep["operators"] >= 6 and rep["protocol"]["mutants"] >= 6, rep["by_operator"]
    assert not rep["missed"] and not rep["false_alarms"], (tmp_path / "m.md").read_text()
    assert "ERROR" not in rep["verdicts"], rep["verdicts"]


def _absorbing_request(tree: Path, body_line: str) -> None:
    """Request.__init__ with `prompt_token_ids` renamed `prompt_tokens` (now optional, last) and a `**kwargs` added,
    `body_line` put before the attribute is set (a use of the mapping, or nothing)."""
    path = tree / "vllm/v1/request.py"
    text = path.read_text()
    for old, new in (
        ("        prompt_token_ids: list[int] | None,\n        sampling_params", "        sampling_params"),
        (
            "        self.prompt_token_ids = prompt_token_ids\n",
            f"{body_line}        self.prompt_token_ids = prompt_tokens\n",
        ),
        (
            "    ) -> None:\n        self.request_id = request_id\n",
            "        prompt_tokens: list[int] | None = None,\n        **kwargs,\n    ) -> None:\n"
            "        self.request_id = request_id\n",
        ),
    ):
        assert text.count(old) == 1, f"the 0.32.0 sources no longer hold {old!r}"
        text = text.replace(old, new)
    compile(text, str(path), "exec")
    path.write_text(text)


def test_a_keyword_renamed_behind_kwargs_is_dropped_not_accepted(fabricate):
    """speculators calls Request(prompt_token_ids=...); the callee renamed the parameter and took **kwargs: the call
    still succeeds and the prompt is silently lost. A signature with **kwargs accepts the keyword; its body never
    reads it: a finding (the gate once called it accepted, and SAFE)."""
    tree, gate = fabricate
    _absorbing_request(tree, "")
    rc, rep, md = gate()
    [kw] = [f for f in _findings(rep, "request", "keyword-removed") if "prompt_token_ids=" in f["symbol"]]
    assert "never read: the value is dropped" in kw["new"] and kw["status"] == "uncovered", md
    assert rc == 1, md


def test_a_keyword_read_from_kwargs_by_name_is_accepted(fabricate):
    tree, gate = fabricate
    _absorbing_request(tree, '        prompt_tokens = kwargs.pop("prompt_token_ids", prompt_tokens)\n')
    rc, rep, md = gate()
    assert not [f for f in _findings(rep, "request", "keyword-removed") if "prompt_token_ids=" in f["symbol"]], md


def test_a_set_up_step_in_the_override_the_multiprocess_engine_runs_is_a_finding(fabricate):
    """vLLM's multiprocess engine runs EngineCoreProc, not EngineCore: a step added in an override of
    `_initialize_kv_caches` there runs where EngineCore's base method would not show it (the gate once read only
    the base class, and said SAFE)."""
    tree, gate = fabricate
    core = tree / "vllm/v1/engine/core.py"
    text = core.read_text()
    anchor = "class EngineCoreProc(EngineCore):\n"
    assert text.count(anchor) == 1, "the 0.32.0 sources no longer hold the class this test extends"
    override = (
        "    def _initialize_kv_caches(self, vllm_config):\n"
        "        self.model_executor.prime_kv_cache()\n"
        "        return super()._initialize_kv_caches(vllm_config)\n\n"
    )
    body = text.index("\n", text.index('"""', text.index(anchor) + len(anchor) + 4) + 3) + 1  # after the docstring
    core.write_text(text[:body] + "\n" + override + text[body:])
    compile(core.read_text(), str(core), "exec")
    rc, rep, md = gate()
    [step] = _findings(rep, "kvlayout", "setup-step-skipped")
    assert step["symbol"].endswith("executor.prime_kv_cache()") and step["status"] == "uncovered", md
    assert rc == 1 and rep["verdict"] == "NEEDS-NEW-SHIM", md
    changed = {c["key"]: c for c in rep["unclassified"] + rep["classified"]}
    assert "vllm.v1.engine.core:EngineCoreProc._initialize_kv_caches" in changed, "the override is on the path"


# -- indirections: a step that runs without a call naming it where it is added -----------------------------
INDIRECT = {
    "a decorator this module defines": (
        "def _primed(fn):\n"
        "    def wrapper(self, *args, **kwargs):\n"
        "        self.model_executor.prime_kv_cache()\n"
        "        return fn(self, *args, **kwargs)\n"
        "    return wrapper\n\n\n",
        "    @_primed\n    @instrument(",
        "",
        "vllm.v1.engine.core:_primed",
    ),
    "a mixin base class's method": (
        "class _KVPrimer:\n    def _prime_caches(self):\n        self.model_executor.prime_kv_cache()\n\n\n",
        "",
        "        self._prime_caches()\n",
        "vllm.v1.engine.core:_KVPrimer._prime_caches",
    ),
    "getattr with a module constant": (
        '_PRIME = "prime_kv_cache"\n\n\n',
        "",
        "        getattr(self.model_executor, _PRIME)()\n",
        "vllm.v1.engine.core:EngineCore._initialize_kv_caches",  # the call and its name, `_PRIME`
    ),
    "a property read": (
        "",
        "    @property\n    def _primed(self):\n        self.model_executor.prime_kv_cache()\n        return True\n\n"
        "    @instrument(",
        "        assert self._primed\n",
        "vllm.v1.engine.core:EngineCore._primed",
    ),
}


@pytest.mark.parametrize("how", list(INDIRECT))
def test_a_set_up_step_behind_an_indirection_is_a_finding_that_shows_the_step(fabricate, how):
    """A step behind a decorator, a mixin, `getattr` or a property runs as surely as `self.m()`: the set-up reader
    names it (NEEDS-NEW-SHIM, not SAFE or REVIEW with only the call line), and the code that makes the step is among
    the listed changes."""
    tree, gate = fabricate
    top, method_prefix, call, shown = INDIRECT[how]
    core = tree / "vllm/v1/engine/core.py"
    text = core.read_text()
    assert SETUP_ANCHOR in text and text.count("class EngineCore:\n") == 1, "0.32.0's core.py changed"
    if top:
        text = text.replace("class EngineCore:\n", top + "class EngineCore:\n", 1)
    if "_KVPrimer" in top:
        text = text.replace("class EngineCore:\n", "class EngineCore(_KVPrimer):\n", 1)
    if method_prefix:
        anchor = '    @instrument(span_name="Prepare model")\n    def _initialize_kv_caches('
        assert text.count(anchor) == 1
        text = text.replace(anchor, method_prefix + anchor[len("    @instrument(") :], 1)
    text = text.replace(SETUP_ANCHOR, SETUP_ANCHOR + call, 1) if call else text
    core.write_text(text)
    compile(text, str(core), "exec")
    rc, rep, md = gate()
    [step] = _findings(rep, "kvlayout", "setup-step-skipped")
    assert step["symbol"].endswith("executor.prime_kv_cache()") and step["status"] == "uncovered", md
    assert rc == 1 and rep["verdict"] == "NEEDS-NEW-SHIM", md
    listed = {c["key"]: c for c in rep["unclassified"] + rep["classified"]}
    made = "_PRIME" if "getattr" in how else "prime_kv_cache"
    assert shown in listed and made in listed[shown]["diff"], (how, sorted(listed))


def test_a_decorator_on_a_worker_path_is_followed_into_its_body(fabricate):
    """The worker's paths have no targeted check for a new step: the change is listed for review, and what a reviewer
    reads is the decorator's new code, not only the `@name` line added above the method."""
    tree, gate = fabricate
    worker = tree / "vllm/v1/worker/gpu_worker.py"
    text = worker.read_text()
    anchor = "    def load_model(self, *, load_dummy_weights: bool = False) -> None:\n"
    assert text.count(anchor) == 1 and text.count("\nclass Worker(") == 1, "0.32.0's gpu_worker.py changed"
    deco = (
        "def _warm_first(fn):\n"
        "    def wrapper(self, *args, **kwargs):\n"
        "        self.model_runner.mutant_warm_up()\n"
        "        return fn(self, *args, **kwargs)\n"
        "    return wrapper\n\n\n"
    )
    text = text.replace("\nclass Worker(", "\n" + deco + "class Worker(", 1).replace(
        anchor, "    @_warm_first\n" + anchor
    )
    worker.write_text(text)
    rc, rep, md = gate()
    listed = {c["key"]: c for c in rep["unclassified"]}
    new = listed.get("vllm.v1.worker.gpu_worker:_warm_first")
    assert new is not None and new["kind"] == "new" and "mutant_warm_up" in new["diff"], sorted(listed)
    assert rc != 0 and rep["verdict"] != "SAFE", md
