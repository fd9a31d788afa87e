"""`bench`: extraction against plain prefill on a tiny model, on the installed vLLM (the CPU suite's timing)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.support.paths import REPORTS


def cmd_bench(args) -> int:
    from harness.scenarios import bench

    result = bench.run(args.model, pairs=args.pairs)
    path = bench.write(args.env, result, Path(args.report_dir))
    print(
        f"harness bench: {result['model']}, {result['tokens']} tokens: {result['verdict']}; extraction "
        f"{result['extract_tokens_per_s']:.0f} tok/s, prefill {result['prefill_tokens_per_s']:.0f} tok/s (medians) "
        f"-> {path}"
    )
    return 0


def add_parser(sub) -> None:
    """`bench`."""
    b = sub.add_parser("bench", help="extraction vs plain prefill throughput (writes reports/<env>.bench.json)")
    b.add_argument(
        "--env", default=os.environ.get("HARNESS_ENV", "local"), help="the report's name: <report-dir>/<env>.bench.json"
    )
    b.add_argument("--model", default="tiny-llama", help="the tiny model to time (a fixture name in fixtures/models/)")
    b.add_argument("--pairs", type=int, default=5, help="interleaved plain/extraction pairs after a warm-up (>= 1)")
    b.add_argument("--report-dir", default=str(REPORTS), help="where the bench report goes")
    b.set_defaults(fn=cmd_bench)
