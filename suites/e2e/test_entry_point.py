"""The public entry point does what the suites do: `patched_generator(path)` on a checkpoint whose MLA the platform
cannot run starts with no other call (the suites go through `mla.prepare`; a user does not). In a child
interpreter without VLLM_MLA_DISABLE, since this session's own generators have already set it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.contracts import mla
from harness.native.engine_log import root_cause
from harness.subjects import models
from harness.testing.recording import not_applicable, not_applicable_if_declared_broken

_CHILD = """
import json, os, sys
from harness.runtime.generator import patched_generator
with patched_generator(sys.argv[1], [1]) as gen:
    out = gen.generate([[3, 4, 5, 6], [7, 8]])
print("RESULT", json.dumps({"rows": [[int(h.shape[0]) for h in r["hidden_states"]] for r in out],
                            "mla_disabled": os.environ.get("VLLM_MLA_DISABLE")}))
"""


def test_patched_generator_starts_tiny_kimi_with_no_other_call(record_e2e, expectations):
    model = models.build("tiny-kimi-k25")
    absent = model.absent_from_vllm()
    if absent:
        record_e2e(model.name, "patched_generator(path) starts with no other call", "n/a", absent)
        not_applicable(absent)
    env = {k: v for k, v in os.environ.items() if k != mla.ENV}
    proc = subprocess.run(
        [sys.executable, "-c", f"if __name__ == '__main__':\n    exec({_CHILD!r})", str(model.path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or not line:
        cause = root_cause(proc.stdout + "\n" + proc.stderr) or f"exit {proc.returncode}, no exception in its output"
        record_e2e(model.name, "patched_generator(path) starts with no other call", "fail", cause)
        not_applicable_if_declared_broken(expectations, model.name, cause)
        raise AssertionError(cause)
    got = json.loads(line.split(" ", 1)[1])
    assert got["rows"] == [[4], [2]], got
    record_e2e(
        "tiny-kimi-k25",
        "patched_generator(path) starts with no other call",
        "pass",
        f"rows {got['rows']}; VLLM_MLA_DISABLE in the child: {got['mla_disabled']!r}",
    )
