"""`gpu-nightly`: the GPU tier on a team's local checkpoint, with a dated report and the drift since the last one."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harness.commands import refuse
from harness.commands.run import NO_SUITES, suite_args
from harness.support.paths import REPORTS


def cmd_gpu_nightly(args) -> int:
    """The GPU tier with a dated report; exit 1 if a test fails or the hidden states drifted since the last night."""
    import pytest

    from harness.gpu import tier as gpu_tier

    argv = suite_args(["suites/gpu"])
    if argv is None:
        return refuse(NO_SUITES)
    argv += [
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
        "--harness-env",
        args.env,
        "--model-path",
        args.model_path,
        "--tp",
        str(args.tp),
        "--dtype",
        args.dtype,
        "--gpu-report-dir",
        args.report_dir,
    ]
    for flag, value in (
        ("--layer-ids", args.layer_ids),
        ("--attention-backend", args.attention_backend),
        ("--prompts", args.prompts),
        ("--gpu-memory-utilization", args.gpu_memory_utilization),
        ("--throughput-pairs", args.throughput_pairs),
    ):
        if value is not None:
            argv += [flag, str(value)]
    rc = int(pytest.main(argv + list(args.pytest_args)))
    name = gpu_tier.report_name(Path(args.model_path).name, args.tp, args.dtype)
    written = sorted(
        Path(args.report_dir).glob(f"{gpu_tier.today()}-{name}-vllm*.json"), key=lambda p: p.stat().st_mtime
    )
    report = written[-1] if written else Path(args.report_dir) / f"{gpu_tier.today()}-{name}-vllm<version>.json"
    if report.is_file():
        drift = json.loads(report.read_text())["drift"]
        if drift.get("outcome") == gpu_tier.NO_BASELINE:
            print(f"harness: {report}: NO BASELINE: {drift['changes'][0]}; this report is the baseline from now on")
        else:
            print(
                f"harness: {report}: drift vs {drift['compared_with']}: "
                + ("DRIFT: " + "; ".join(drift["changes"]) if drift["drifted"] else "none (bitwise equal)")
            )
        if drift["drifted"] and rc == 0:
            rc = 1
    elif rc == 0:
        print(f"harness: no report was written ({report}); the tier did not run", file=sys.stderr)
        rc = 2
    return rc


def add_parser(sub) -> None:
    """`gpu-nightly`."""
    n = sub.add_parser("gpu-nightly", help="the GPU tier (-m gpu) with a dated report and drift check")
    n.add_argument("--model-path", required=True, help="the checkpoint folder (local; nothing is downloaded)")
    n.add_argument("--tp", type=int, default=8, help="tensor_parallel_size (default 8)")
    n.add_argument("--dtype", default="bfloat16", help="bfloat16 | float16 | float32 (default bfloat16)")
    n.add_argument("--layer-ids", help="comma-separated layer ids (default: speculators' choice)")
    n.add_argument("--attention-backend", help="e.g. TRITON_MLA (default: vLLM's choice)")
    n.add_argument("--prompts", help="prompt set JSON (default fixtures/prompts/gpu-prompts.json)")
    n.add_argument("--gpu-memory-utilization", type=float, help="vLLM's share of each GPU (default 0.8)")
    n.add_argument("--throughput-pairs", type=int, help="timed calls a side against plain prefill (default 5; 0: none)")
    n.add_argument(
        "--report-dir",
        default=str(REPORTS / "gpu"),
        help="where the dated report goes; the committed reports/gpu is read for the drift baseline too",
    )
    n.add_argument("--env", default=os.environ.get("HARNESS_ENV", "gpu-nightly"), help="the env report's name")
    n.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    n.set_defaults(fn=cmd_gpu_nightly)
