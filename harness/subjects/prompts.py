"""The harness's random prompts: one generator for every suite and benchmark."""

from __future__ import annotations

import random


def random_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    """`n` prompts of `lo`..`hi` token ids drawn from [4, vocab) (ids 0-3 are the tiny tokenizers' special
    tokens), seeded: `random.Random` keeps its algorithm across Python versions, so every machine gets the
    same prompts."""
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
