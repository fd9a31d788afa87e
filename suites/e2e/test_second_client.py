"""speculators 0.4.0's own generator (unshimmed; it ported the same fixes upstream) agrees with ours.

Runs only where 0.4.0 supports the installed vLLM (its declared datagen range, read from its wheel).
Same tiny Llama, same prompts, same layers, float32: our speculators 0.3.0 + shims vs 0.4.0 as shipped
(given only a CPU memory budget, which is not a vLLM contract). Tolerance 1e-6 (same vLLM, same kernels).
"""

from __future__ import annotations



from harness import second_client
from harness.prompts import random_prompts
from harness.testing.recording import not_applicable

TOL = 1e-6


def test_speculators_040_matches_ours(runs, tmp_path, record_e2e):
    tree = second_client.wheel_dir()
    ok, why = second_client.supports_installed_vllm(tree)
    if not ok:
        record_e2e("tiny-llama", "speculators 0.4.0 (second client) agrees", "n/a", why)
        not_applicable(why)
    run = runs("tiny-llama")
    layers = sorted(set(run.generator.layer_ids))
    prompts = random_prompts(6, 17, 120, run.model.vocab_size, seed=11)
    theirs = second_client.run(tree, run.model.path, layers, prompts, tmp_path / "spec040.pt")
    assert theirs["speculators_file"].startswith(str(tree)), "the child did not run speculators 0.4.0"
    ours = run.generator.generate(prompts)
    order = run.generator.layer_ids
    d = max(float((ours_r["hidden_states"][order.index(k)].float() - t[i]).abs().max())
            for ours_r, t in zip(ours, theirs["hidden_states"]) for i, k in enumerate(layers))
    assert theirs["input_ids"] == prompts
    record_e2e("tiny-llama", "speculators 0.4.0 (second client) agrees", "pass" if d <= TOL else "fail",
               f"max abs diff {d:.2e} over {sum(map(len, prompts))} tokens, layers {layers} ({why})", max_abs_diff=d)
    assert d <= TOL
