"""speculators 0.4.0's own generator (unshimmed; it ported the same fixes upstream) agrees with ours.

Runs only where 0.4.0 supports the installed vLLM (its declared datagen range, read from its wheel).
Same tiny Llama, same prompts, same layers, float32: our speculators 0.3.0 + shims vs 0.4.0 as shipped
(given only a CPU memory budget, which is not a vLLM contract). Tolerance 1e-6 (same vLLM, same kernels).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from harness.clients import second_client
from harness.subjects import models
from harness.subjects.prompts import random_prompts
from harness.testing import ahead
from harness.testing.recording import not_applicable

TOL = 1e-6
MODEL = "tiny-llama"


@ahead.job("second-client")
def _theirs():
    """0.4.0's generator on the shared generator's model, layers and prompts, in a child interpreter (in the
    background: harness.testing.ahead); or why it does not apply to the installed vLLM. The model is built and
    the inputs chosen here, in the starting thread; the thread only runs the child."""
    tree = second_client.wheel_dir()
    ok, why = second_client.supports_installed_vllm(tree)
    if not ok:
        return lambda: {"applies": False, "why": why}
    model = models.build(MODEL)
    layers = sorted(set(model.probe_layers))
    prompts = random_prompts(6, 17, 120, model.vocab_size, seed=11)
    job_env = ahead.env()

    def child() -> dict:
        with tempfile.TemporaryDirectory(prefix="harness-spec040-") as tmp:
            out = second_client.run_child(tree, model.path, layers, prompts, Path(tmp) / "spec040.pt", base_env=job_env)
            data = out.read_bytes()  # loaded by the test (torch in the main thread), after the folder is gone
        return {"applies": True, "why": why, "tree": str(tree), "layers": layers, "prompts": prompts, "theirs": data}

    return child


@pytest.mark.ahead("second-client")
def test_speculators_040_matches_ours(runs, record_e2e):
    job = ahead.result("second-client")
    if not job["applies"]:
        record_e2e(MODEL, "speculators 0.4.0 (second client) agrees", "n/a", job["why"])
        not_applicable(job["why"])
    run = runs(MODEL)
    layers, prompts, theirs = job["layers"], job["prompts"], second_client.load(job["theirs"])
    assert layers == sorted(set(run.generator.layer_ids)), (
        "the child ran other layers than the shared generator captures"
    )
    assert theirs["speculators_file"].startswith(job["tree"]), "the child did not run speculators 0.4.0"
    ours = run.generator.generate(prompts)
    order = run.generator.layer_ids
    d = max(
        float((ours_r["hidden_states"][order.index(k)].float() - t[i]).abs().max())
        for ours_r, t in zip(ours, theirs["hidden_states"], strict=True)
        for i, k in enumerate(layers)
    )
    assert theirs["input_ids"] == prompts
    record_e2e(
        MODEL,
        "speculators 0.4.0 (second client) agrees",
        "pass" if d <= TOL else "fail",
        f"max abs diff {d:.2e} over {sum(map(len, prompts))} tokens, layers {layers} ({job['why']})",
        max_abs_diff=d,
    )
    assert d <= TOL
