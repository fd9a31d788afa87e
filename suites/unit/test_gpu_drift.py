"""The GPU nightly's drift check: a baseline is found by what identifies the run, never by a folder's name."""

from __future__ import annotations

import json
import shutil

import torch
from safetensors.torch import save_file

from harness.gpu import tier as gpu_tier


def _checkpoint(path, weight: torch.Tensor):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 4, "vocab_size": 8}))
    save_file({"w": weight}, str(path / "model.safetensors"))
    return path


def _results(scale: float = 1.0):
    g = torch.Generator().manual_seed(0)
    return [
        {"hidden_states": [torch.randn(5, 4, generator=g) * scale, torch.randn(5, 4, generator=g)]} for _ in range(2)
    ]


def test_a_rebuilt_checkpoint_in_another_folder_keeps_its_key(tmp_path):
    w = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    a = _checkpoint(tmp_path / "tiny-llama-aaaa", w)
    b = tmp_path / "tiny-llama-bbbb"
    shutil.copytree(a, b)

    def key(p, **kw):
        return gpu_tier.run_key(p, kw.get("tp", 1), "bfloat16", [[1, 2, 3]], kw.get("layers", [0, 1]))["key"]

    assert key(a) == key(b)
    assert key(a) != key(a, tp=2) and key(a) != key(a, layers=[1])
    c = _checkpoint(tmp_path / "tiny-llama-aaaa-changed", w + torch.tensor([[0, 0, 0, 1e-3], [0, 0, 0, 0]]))
    assert key(c) != key(a)


def test_identical_states_no_drift_one_changed_value_drift_and_no_baseline_is_distinct(tmp_path):
    fp = gpu_tier.fingerprint(_results(), [0, 1])
    assert gpu_tier.compare(fp, gpu_tier.fingerprint(_results(), [0, 1]), "earlier").outcome == gpu_tier.NO_DRIFT
    changed = _results()
    changed[1]["hidden_states"][0][2, 3] += 1e-6
    d = gpu_tier.compare(fp, gpu_tier.fingerprint(changed, [0, 1]), "earlier")
    assert d.outcome == gpu_tier.DRIFT and d.drifted and "layer 0: bytes differ" in d.changes[0]
    none = gpu_tier.compare(None, fp)
    assert none.outcome == gpu_tier.NO_BASELINE and not none.drifted and none.compared_with is None


def test_baseline_is_the_newest_earlier_report_with_the_same_key(tmp_path):
    for name, key in (
        ("2026-11-29-tiny-llama-aaaa-tp1-bfloat16.json", "k"),
        ("2026-11-30-other.json", "other"),
        ("2026-12-01-tiny-llama-bbbb-tp1-bfloat16.json", "k"),
        ("2026-12-02-x.json", "k"),
    ):
        (tmp_path / name).write_text(json.dumps({"run_key": {"key": key}, "fingerprint": {}}))
    name, _ = gpu_tier.baseline(tmp_path, "k", "2026-12-02")
    assert name.startswith("2026-12-01-tiny-llama-bbbb")
    assert gpu_tier.baseline(tmp_path, "new", "2026-12-02") is None


def test_the_committed_reports_are_a_baseline_for_a_run_that_writes_elsewhere(tmp_path):
    """A fresh checkout's nightly writes to its own folder: the committed report of the same key is its baseline,
    also one of the same day; the file the run itself writes never is."""
    committed, out = tmp_path / "committed", tmp_path / "out"
    committed.mkdir()
    out.mkdir()
    (committed / "2026-12-03-tiny-llama-tp1-bfloat16.json").write_text(json.dumps({"run_key": {"key": "k"}}))
    (out / "2026-12-03-tiny-llama-tp1-bfloat16.json").write_text(json.dumps({"run_key": {"key": "k"}, "mine": 1}))
    name, rep = gpu_tier.baseline(
        [out, committed], "k", "2026-12-03", exclude=out / "2026-12-03-tiny-llama-tp1-bfloat16.json"
    )
    assert name == "2026-12-03-tiny-llama-tp1-bfloat16.json" and "mine" not in rep
    assert gpu_tier.baseline([out], "k", "2026-12-03", exclude=out / "2026-12-03-tiny-llama-tp1-bfloat16.json") is None
