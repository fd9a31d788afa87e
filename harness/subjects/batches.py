"""Batches that real extraction runs feed a generator, and the checks that tell whether their rows came back
right: C-chunkedprefill's probe and shim proof run them, and so does the e2e suite.

Row counts cannot show rows that belong to another prompt, so the checks compare each prompt's rows with the same
prompt extracted on its own. A batch's shape changes the kernels' blocking, not the values: ORDER_TOL is far
below the ~1 a row of another request (or a shifted row) differs by.
"""

from __future__ import annotations

PROMPT_TOKENS = 300
ORDER_TOL = 1e-4
#: Prompts per call in `repeated_calls`: short, so many calls cost little.
CALL_PROMPTS, CALL_TOKENS = 8, 16


def straddling_batch(budget: int, vocab: int) -> list[list[int]]:
    """Prompts of PROMPT_TOKENS tokens, one step's budget in all plus two prompts, so that a prompt boundary
    does not line up with the step boundary (300 does not divide 8192)."""
    n = budget // PROMPT_TOKENS + 2
    return [[(7 * i + 3 * j) % (vocab - 4) + 4 for j in range(PROMPT_TOKENS)] for i in range(n)]


def unequal_batch(vocab: int, lengths=(48, 40, 32, 24, 16, 8)) -> list[list[int]]:
    """Prompts of falling lengths, one step in all: a runner that sorts a step's requests by token count (V2)
    captures them in the reverse of the order they were added."""
    return [[(5 * i + 11 * j) % (vocab - 4) + 4 for j in range(n)] for i, n in enumerate(lengths)]


def in_order(gen, batch: list[list[int]], tail: int = 5) -> None:
    """Extract `batch`; the last prompts' rows must be their own: equal to those prompts extracted on their own."""
    results = gen.generate(batch)
    alone = gen.generate(batch[-tail:])
    worst = max(
        float((a - b).abs().max())
        for ra, rb in zip(alone, results[-tail:], strict=True)
        for a, b in zip(ra["hidden_states"], rb["hidden_states"], strict=True)
    )
    if worst > ORDER_TOL:
        raise AssertionError(
            f"rows are not in request order: the last {tail} prompts differ from themselves "
            f"extracted alone by {worst:.3g}"
        )


def each_own(gen, batch: list[list[int]]) -> None:
    """Extract `batch`; every prompt's rows must equal that prompt extracted on its own."""
    results = gen.generate(batch)
    worst = max(
        float((a - b).abs().max())
        for prompt, got in zip(batch, results, strict=True)
        for a, b in zip(gen.generate([prompt])[0]["hidden_states"], got["hidden_states"], strict=True)
    )
    if worst > ORDER_TOL:
        raise AssertionError(
            f"rows are not in request order: a step of {len(batch)} prompts of unequal lengths "
            f"differs from the prompts extracted alone by {worst:.3g}"
        )


def repeated_calls(gen, max_num_seqs: int) -> int:
    """Calls of CALL_PROMPTS short prompts, twice the scheduler's `max_num_seqs` requests in all and one call more,
    as a training-data job makes them: a runner that keeps a slot per finished request runs out on the way.
    Every call's rows are checked against its token counts by the generator; returns the number of calls."""
    calls = 2 * max_num_seqs // CALL_PROMPTS + 1
    vocab = gen.vocab_size
    for c in range(calls):
        gen.generate(
            [[(13 * c + 5 * i + j) % (vocab - 4) + 4 for j in range(CALL_TOKENS)] for i in range(CALL_PROMPTS)]
        )
    return calls
