"""Progress lines: what, how far of how much, an estimate of what is left, elapsed; throttled."""

import io

from harness.support.progress import Progress


def test_progress_says_how_far_and_how_long_is_left():
    out = io.StringIO()
    p = Progress("gate: downloading vllm-0.33.0.tar.gz", 10e6, every_s=0.0, stream=out)
    p.advance(2.5e6)
    p.finish()
    first, last = out.getvalue().splitlines()
    assert first.startswith("gate: downloading vllm-0.33.0.tar.gz: 2.5 of 10.0 MB, ~") and "s left" in first
    assert last.endswith("(done)")


def test_progress_is_throttled():
    out = io.StringIO()
    p = Progress("x", None, every_s=3600, stream=out)
    for _ in range(100):
        p.advance(1e6)
    assert out.getvalue() == ""
