"""`gate --client speculators==0.9.0`: speculators' current path (vllm serve + native export + hs-connectors) read
statically from real vLLM sources (the gate's cache; downloaded on first use), plus one fabricated change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.gate import artifacts, client

CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"


def _gate(tmp_path, *args) -> tuple[int, dict | None, str]:
    out = tmp_path / "gate.json"
    p = subprocess.run([sys.executable, "-m", "harness", "gate", "--client", "speculators==0.9.0", *args,
                        "--json", str(out)], capture_output=True, text=True, timeout=900)
    return p.returncode, (json.loads(out.read_text()) if out.is_file() else None), p.stdout + p.stderr


def test_moving_up_to_032_is_safe_and_down_to_017_is_broken(tmp_path):
    rc, rep, said = _gate(tmp_path, "--from", "0.16.0", "--to", "0.32.0")
    assert rc == 0 and rep["verdict"] == "SAFE", said
    needs = {n["id"]: n for n in rep["needs"]}
    assert not needs["serve-method"]["from"]["holds"] and needs["serve-method"]["to"]["holds"]  # no export in 0.16
    assert "overrides _write_tensors(tensors, event, filename, lock_fd)" in \
        needs["subclass FP8HiddenStatesConnector(ExampleHiddenStatesConnector)"]["to"]["evidence"]

    rc, rep, said = _gate(tmp_path, "--from", "0.32.0", "--to", "0.17.0")
    assert rc == 1 and rep["verdict"] == "BROKEN", said
    assert "import vllm.v1.kv_cache_interface:HiddenStateCacheSpec" in rep["regressions"], rep["regressions"]


def test_a_changed_private_override_is_a_regression(tmp_path):
    """The FP8 connector overrides the example connector's private _write_tensors: a renamed parameter breaks it."""
    src = artifacts.fetch(artifacts.parse("0.32.0")).root
    fake = tmp_path / "vllm-0.33.0.dev1"
    shutil.copytree(src, fake, copy_function=os.symlink)
    target = fake / CONNECTOR
    text = Path(os.readlink(target)).read_text()
    target.unlink()
    assert "lock_fd: int | None," in text
    target.write_text(text.replace("lock_fd: int | None,", "lock: int | None,", 1))
    rep = client.report("0.9.0", "0.32.0", "fake", client.check("0.9.0", src, fake))
    assert rep["verdict"] == "BROKEN" and rep["regressions"] == ["subclass FP8HiddenStatesConnector(ExampleHiddenStatesConnector)"]
    broken = next(n for n in rep["needs"] if n["id"] in rep["regressions"])
    assert "takes (tensors, event, filename, lock) here, (tensors, event, filename, lock_fd) on the other side" \
        in broken["to"]["evidence"]


@pytest.mark.parametrize("bad, said", [("speculators==0.5.0", "no used surface recorded for speculators 0.5.0"),
                                       ("speculators>=0.9", "expected speculators==X.Y.Z")])
def test_a_client_without_a_recorded_surface_is_one_line_and_exit_2(tmp_path, bad, said):
    p = subprocess.run([sys.executable, "-m", "harness", "gate", "--client", bad, "--to", "0.32.0",
                        "--json", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and said in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "g.json").exists()
