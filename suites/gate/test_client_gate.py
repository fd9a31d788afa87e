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

from harness.gate.obtain import artifacts
from harness.gate.read import client

CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"


def _gate(tmp_path, *args) -> tuple[int, dict | None, str]:
    out = tmp_path / "gate.json"
    p = subprocess.run(
        [sys.executable, "-m", "harness", "gate", "--client", "speculators==0.9.0", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    return p.returncode, (json.loads(out.read_text()) if out.is_file() else None), p.stdout + p.stderr


def test_moving_up_to_032_is_safe_and_down_to_017_is_broken(tmp_path):
    rc, rep, said = _gate(tmp_path, "--from", "0.16.0", "--to", "0.32.0")
    assert rc == 0 and rep["verdict"] == "SAFE", said
    needs = {n["id"]: n for n in rep["needs"]}
    assert not needs["serve-method"]["from"]["holds"] and needs["serve-method"]["to"]["holds"]  # no export in 0.16
    assert (
        "overrides _write_tensors(tensors, event, filename, lock_fd)"
        in needs["subclass FP8HiddenStatesConnector(ExampleHiddenStatesConnector)"]["to"]["evidence"]
    )

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
    assert rep["verdict"] == "BROKEN" and rep["regressions"] == [
        "subclass FP8HiddenStatesConnector(ExampleHiddenStatesConnector)"
    ]
    broken = next(n for n in rep["needs"] if n["id"] in rep["regressions"])
    assert (
        "takes (tensors, event, filename, lock) here, (tensors, event, filename, lock_fd) on the other side"
        in broken["to"]["evidence"]
    )


@pytest.mark.parametrize(
    "bad, said",
    [
        ("speculators==0.7.0", "no used surface recorded for speculators 0.7.0"),
        ("speculators>=0.9", "expected speculators==X.Y.Z"),
    ],
)
def test_a_client_without_a_recorded_surface_is_one_line_and_exit_2(tmp_path, bad, said):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "gate",
            "--client",
            bad,
            "--to",
            "0.32.0",
            "--json",
            str(tmp_path / "g.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and said in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "g.json").exists()


def test_the_lock_file_chooses_the_baseline_and_the_client_path(tmp_path):
    """A team's requirements: vLLM's CPU build of 0.16.0 (a local version) in an included file and speculators
    0.8.0, whose own declared hs-connectors (0.8.0) is the surface judged."""
    (tmp_path / "base.txt").write_text("vllm==0.16.0+cpu\n")
    (tmp_path / "requirements.txt").write_text("-r base.txt\nspeculators==0.8.0\n")
    out = tmp_path / "gate.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "gate",
            "--lockfile",
            str(tmp_path / "requirements.txt"),
            "--to",
            "0.32.0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    rep = json.loads(out.read_text())
    assert p.returncode == 0 and rep["verdict"] == "SAFE", p.stdout[-2000:] + p.stderr[-2000:]
    assert (rep["client"], rep["connectors"], rep["from"], rep["to"]) == (
        "speculators 0.8.0",
        "hs-connectors 0.8.0",
        "0.16.0",
        "0.32.0",
    )
    (tmp_path / "old.txt").write_text("vllm==0.16.0\nspeculators==0.5.0\n")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "gate",
            "--lockfile",
            str(tmp_path / "old.txt"),
            "--to",
            "0.32.0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    rep = json.loads(out.read_text())
    assert rep["connectors"] == "vLLM's own connector" and {n["id"] for n in rep["needs"]} == {
        "serve-method",
        "serve-connector",
    }, p.stderr[-2000:]


def test_a_pull_request_is_judged_from_the_base_pin_to_the_head_pin(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "uv.lock").write_text(
        'version = 1\n[[package]]\nname = "vllm"\nversion = "0.16.0"\n'
        '[[package]]\nname = "speculators"\nversion = "0.9.0"\n'
    )
    (tmp_path / "uv.lock").write_text(
        'version = 1\n[[package]]\nname = "vllm"\nversion = "0.32.0"\n'
        '[[package]]\nname = "speculators"\nversion = "0.9.0"\n'
    )
    out = tmp_path / "gate.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "gate",
            "--base-lockfile",
            str(tmp_path / "base" / "uv.lock"),
            "--lockfile",
            str(tmp_path / "uv.lock"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    rep = json.loads(out.read_text())
    assert p.returncode == 0 and (rep["client"], rep["from"], rep["to"]) == ("speculators 0.9.0", "0.16.0", "0.32.0"), (
        p.stderr[-2000:]
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "gate",
            "--base-lockfile",
            str(tmp_path / "base" / "uv.lock"),
            "--json",
            str(tmp_path / "none.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        p.returncode == 2 and "--base-lockfile needs --lockfile" in p.stderr and not (tmp_path / "none.json").exists()
    )


def test_a_lock_file_without_a_speculators_pin_is_refused_with_the_line_to_add(tmp_path):
    """A lock that pins vLLM but no speculators does not say which extraction path to judge: refused (2, one line
    saying what to add), nothing written, never judged as if it pinned 0.3.0."""
    lock = tmp_path / "uv.lock"
    lock.write_text('version = 1\n[[package]]\nname = "vllm"\nversion = "0.32.0"\n')
    out = tmp_path / "gate.json"
    p = subprocess.run(
        [sys.executable, "-m", "harness", "gate", "--lockfile", str(lock), "--to", "0.34.0", "--json", str(out)],
        capture_output=True,
        text=True,
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "pins no speculators" in lines[0], p.stderr
    assert "speculators==X.Y.Z" in lines[0] and not out.exists()
