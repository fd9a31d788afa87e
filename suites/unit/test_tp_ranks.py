"""The multi-rank row's judgement (harness.testing.ranks.judged): each property speculators assumes across ranks
fails the row when one rank breaks it. The facts come from every worker of a TP=N run (suites/e2e)."""

from __future__ import annotations

import pytest

from harness.testing.ranks import judged

GOOD = [
    {"rank": 0, "captures": 12, "hand_off_buffers": 1, "shims": ["a", "b"]},
    {"rank": 1, "captures": 0, "hand_off_buffers": 0, "shims": ["a", "b"]},
]


def test_ranks_that_behave_as_speculators_assumes_pass():
    held, said = judged(GOOD, replied=0, size=2)
    assert held and "captures per rank 0: 12, 1: 0" in said


@pytest.mark.parametrize(
    "change,replied,says",
    [
        ({}, 1, "the reply asked of rank 0 came from rank 1"),
        ({"captures": 3}, 0, "rank 1 stored captured states 3 times"),
        ({"hand_off_buffers": 1}, 0, "rank 1 made 1 hand-off buffers"),
        ({"shims": ["a"]}, 0, "the ranks apply different shims"),
        ({"rank": 0}, 0, "ranks [0, 0], not 0..1"),
    ],
)
def test_one_rank_breaking_a_property_fails_the_row(change, replied, says):
    facts = [GOOD[0], {**GOOD[1], **change}]
    held, said = judged(facts, replied=replied, size=2)
    assert not held and says in said


def test_rank_0_storing_nothing_fails_the_row():
    held, said = judged([{**GOOD[0], "captures": 0}, GOOD[1]], replied=0, size=2)
    assert not held and "rank 0 stored no captured states" in said
