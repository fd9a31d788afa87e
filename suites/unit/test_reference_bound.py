"""The bound an extraction is held to against transformers: derived from the reference's own float32 error on the
same prompts (harness.subjects.reference.against), checked on a real tiny checkpoint's float32 and float64 forwards:
transformers' own float32 result is inside its bound, a state moved by a fraction of its size is not."""

from __future__ import annotations

import pytest
import torch

from harness.subjects import models, reference
from harness.subjects.prompts import random_prompts

EPS = float(torch.finfo(torch.float32).eps)


def test_the_bound_is_slack_times_the_references_error_never_below_its_rounding():
    big = reference.Comparison(diff=0.0, reference_error=5e-5, magnitude=35.0)
    assert big.bound == pytest.approx(reference.SLACK * 5e-5)
    tiny = reference.Comparison(diff=0.0, reference_error=1e-9, magnitude=3.0)
    assert tiny.bound == pytest.approx(reference.SLACK * EPS * 3.0), "never below the states' own float32 rounding"
    assert "transformers' own float32 error" in big.said()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_transformers_float32_passes_its_own_bound_and_a_moved_state_fails(name, tmp_path):
    model = models.build(name, root=tmp_path)
    prompts = random_prompts(2, 17, 40, model.vocab_size, seed=1)
    layers = [0, model.num_layers - 1]
    own32 = reference.hidden_states(model.path, prompts, layers)
    same = reference.against(own32, model.path, prompts, layers)
    assert same.held and same.diff == pytest.approx(same.reference_error)
    assert same.reference_error > 0, "a float64 forward that is float32 underneath would measure no error"
    moved = [[t + 1e-3 * float(t.abs().max()) for t in per] for per in own32]
    assert not reference.against(moved, model.path, prompts, layers).held
