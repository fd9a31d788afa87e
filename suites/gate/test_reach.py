"""The watched paths on a small tree shaped like vLLM's (no download): what a path reaches through helpers,
`super()`, attributes and `collective_rpc("name")`, what counts as a change, and what is only compatible."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.gate.read import reach

FILES = {
    "vllm/__init__.py": "",
    "vllm/v1/engine/core.py": '''
from vllm.v1.core.sched.scheduler import Scheduler


class EngineCore:
    def __init__(self, executor_class):
        """Builds the executor."""
        self.model_executor = executor_class()
        self._initialize_kv_caches()

    def _initialize_kv_caches(self):
        self._helper()

    def _helper(self):
        self.collective_rpc("warm_caches")

    def collective_rpc(self, method):
        return self.model_executor.collective_rpc(method)

    def shutdown(self):
        self.model_executor.shutdown()
''',
    "vllm/v1/core/sched/scheduler.py": """
class Scheduler:
    def schedule(self):
        return sorted(self.running)
""",
    "vllm/v1/executor/abstract.py": """
class Executor:
    def collective_rpc(self, method):
        return [method]

    def shutdown(self):
        pass
""",
    "vllm/v1/executor/multiproc_executor.py": """
from vllm.v1.executor.abstract import Executor


class MultiprocExecutor(Executor):
    pass
""",
    "vllm/v1/executor/uniproc_executor.py": """
from vllm.v1.executor.abstract import Executor


class UniProcExecutor(Executor):
    pass
""",
    "vllm/v1/worker/worker_base.py": """
class WorkerBase:
    def warm_caches(self):
        return self._warm()

    def _warm(self):
        return 1
""",
    "vllm/v1/worker/gpu_worker.py": """
from vllm.v1.worker.worker_base import WorkerBase
from vllm.v1.worker.gpu_model_runner import GPUModelRunner


class Worker(WorkerBase):
    def __init__(self):
        super().__init__()
        self.model_runner = GPUModelRunner()

    def _warm(self):
        return super()._warm() + 1
""",
    "vllm/v1/worker/cpu_worker.py": """
from vllm.v1.worker.gpu_worker import Worker


class CPUWorker(Worker):
    pass
""",
    "vllm/v1/worker/gpu_model_runner.py": """
class GPUModelRunner:
    def __init__(self):
        self.input_batch = None
""",
}


def tree(tmp_path: Path, name: str, edits: dict[str, tuple[str, str]] | None = None) -> Path:
    root = tmp_path / name
    for rel, text in FILES.items():
        for old, new in [(edits or {}).get(rel, ("", ""))]:
            text = text.replace(old, new) if old else text
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_set_up_path_follows_helpers_wrappers_and_rpc_names(tmp_path):
    root = tree(tmp_path, "a")
    index = reach.Index(root)
    [cuda] = [p for p in reach.platform_roles(root, index) if p.name == "cuda"]
    entries, enter = reach.WATCH["kvlayout"]
    got = reach.reachable(index, cuda, entries, enter)
    assert "vllm.v1.engine.core:EngineCore._helper" in got and "vllm.v1.engine.core:EngineCore.collective_rpc" in got
    step = got["vllm.v1.worker.worker_base:WorkerBase.warm_caches"]
    assert step[2] is False, "a worker method is a step of the set-up path, not followed into"
    assert "vllm.v1.engine.core:EngineCore.shutdown" not in got
    runtime = reach.reachable(index, cuda, *reach.WATCH["runtime"])
    assert "vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__" in runtime


def test_super_reaches_the_next_definition_and_self_the_concrete_one(tmp_path):
    root = tree(tmp_path, "a")
    index = reach.Index(root)
    [cuda] = [p for p in reach.platform_roles(root, index) if p.name == "cuda"]
    got = reach.reachable(index, cuda, (("worker", "warm_caches"),), frozenset({"worker"}))
    assert {"vllm.v1.worker.gpu_worker:Worker._warm", "vllm.v1.worker.worker_base:WorkerBase._warm"} <= set(got)


def test_changes_docstrings_are_not_optional_parameters_are_compatible_the_rest_is_reported(tmp_path):
    old = tree(tmp_path, "old")
    same = tree(tmp_path, "doc", {"vllm/v1/engine/core.py": ('"""Builds the executor."""', '"""Reworded."""')})
    assert reach.changes(reach.Index(old), reach.Index(same), old, same) == []
    optional = tree(
        tmp_path, "opt", {"vllm/v1/engine/core.py": ("def _helper(self):", "def _helper(self, *, x=None):")}
    )
    [c] = reach.changes(reach.Index(old), reach.Index(optional), old, optional)
    assert (c.key, c.kind) == ("vllm.v1.engine.core:EngineCore._helper", "compatible")
    step = tree(
        tmp_path,
        "step",
        {
            "vllm/v1/engine/core.py": (
                'self.collective_rpc("warm_caches")',
                'self.collective_rpc("warm_caches")\n        self.model_executor.prime()',
            )
        },
    )
    [c] = reach.changes(reach.Index(old), reach.Index(step), old, step)
    assert (c.key, c.kind, c.contracts) == ("vllm.v1.engine.core:EngineCore._helper", "changed", ["kvlayout"])
    assert "+    self.model_executor.prime()" in c.diff and c.evidence.startswith("vllm/v1/engine/core.py:")
    off_path = tree(
        tmp_path,
        "off",
        {"vllm/v1/engine/core.py": ("self.model_executor.shutdown()", "self.model_executor.shutdown()\n        x = 1")},
    )
    assert reach.changes(reach.Index(old), reach.Index(off_path), old, off_path) == []


def test_compatible_signature():
    sig = (("self", False, "p"), ("a", False, "p"), ("b", True, "p"))
    assert reach.compatible_signature(sig, sig + (("c", True, "p"),))
    assert reach.compatible_signature(sig, sig + (("c", True, "k"),))
    assert not reach.compatible_signature(sig, sig + (("c", False, "k"),)), "a new required parameter"
    assert not reach.compatible_signature(sig, (("self", False, "p"), ("z", True, "p"), *sig[1:])), "shifted"
    assert not reach.compatible_signature(sig, sig[:2] + (("b", False, "p"),)), "a default lost"
    assert not reach.compatible_signature(sig, sig[:2]), "a parameter removed"


def test_a_diff_is_shown_whole_and_a_new_function_with_its_code():
    """A reviewer reads every changed line: a change at the end of a long function is in its diff (the report once
    cut each diff at 38 lines, and a sort added at the end of InputBatch.condense never showed), and a new function
    on a path is shown with its code, not by name only."""
    from harness.gate.read.reach.compare import function_diff
    from harness.gate.read.reach.index import Fn

    body = [f"    x{i} = {i}" for i in range(60)]
    old = Fn("m:f", "m.py", 10, 80, "\n".join(["def f():", *body, "    return x0"]), (), "a")
    new = Fn(
        "m:f", "m.py", 10, 81, "\n".join(["def f():", "    y = 1", *body, "    x.sort()", "    return x0"]), (), "b"
    )
    diff = function_diff(old, new)
    assert "+    y = 1" in diff and "+    x.sort()" in diff
    added = function_diff(None, Fn("m:g", "m.py", 90, 92, "def g():\n    return step()", (), "c"))
    assert added == "+def g():\n+    return step()"


LOGGED = """
import logging

logger = logging.getLogger(__name__)
"""


def _one_change(tmp_path, name, old_text, new_text):
    """The changes one edit of EngineCore._helper (on the set-up path, in a module with a logger) makes."""
    import shutil

    core = "vllm/v1/engine/core.py"
    old = tree(tmp_path, f"{name}-old", {core: ("from vllm.v1.core", LOGGED + "from vllm.v1.core")})
    (old / core).write_text((old / core).read_text().replace('self.collective_rpc("warm_caches")', old_text))
    new = tmp_path / f"{name}-new"
    shutil.copytree(old, new)
    (new / core).write_text((new / core).read_text().replace(old_text, new_text))
    return reach.changes(reach.Index(old), reach.Index(new), old, new)


HELPER = 'method = "warm_caches"\n        return self.collective_rpc(method)'


@pytest.mark.parametrize(
    "new,why",
    [
        ('name = "warm_caches"\n        return self.collective_rpc(name)', "local names"),
        ('logger.debug("warming %s", self)\n        ' + HELPER, "logging calls"),
        ('method: str = "warm_caches"\n        return self.collective_rpc(method)', "type annotations"),
        (
            'logger.info("warm")\n        name: str = "warm_caches"\n        return self.collective_rpc(name)',
            "type annotations and logging calls and local names",
        ),
    ],
)
def test_a_neutral_edit_is_classified_by_rule_and_still_listed(tmp_path, new, why):
    [c] = _one_change(tmp_path, "n", HELPER, new)
    assert (c.key, c.kind) == ("vllm.v1.engine.core:EngineCore._helper", "neutral")
    assert c.why == f"neutral: only {why} differ" and c.diff, "listed with its diff, never dropped"


@pytest.mark.parametrize(
    "new",
    [
        'logger.debug("warming %s", self.queue.pop())\n        ' + HELPER,  # the log line's argument changes state
        'log.debug("warming")\n        ' + HELPER,  # no such logger in the module: a NameError at run time
        'method = "warm_caches"\n        return self.collective_rpc(Scheduler)',  # reads another binding
        'method = "warm_caches"\n        self.model_executor.prime()\n        return self.collective_rpc(method)',
    ],
)
def test_an_edit_the_rule_does_not_cover_stays_changed(tmp_path, new):
    [c] = _one_change(tmp_path, "c", HELPER, new)
    assert c.kind == "changed" and not c.why
