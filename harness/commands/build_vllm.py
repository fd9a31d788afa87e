"""`build-vllm`: vLLM's CPU backend built from a release's sdist and installed (`harness.envs.source_build`), for the
releases PyPI has no CPU wheel of."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.commands import refuse
from harness.envs.source_build import BuildFailed, BuildRefused, build, cache_root, cached, install, recipe
from harness.support.paths import FIXTURES


def cmd_build_vllm(args) -> int:
    """A refusal or a failed build is one line, exit 2."""
    try:
        rec = recipe(args.version)
        wheel = None if args.rebuild else cached(rec)
        if wheel is None:
            work = Path(args.workdir) if args.workdir else cache_root() / "work" / f"vllm-{rec.version}"
            print(
                f"harness build-vllm: building vLLM {rec.version} (CPU) from its sdist in {work}; log {work / 'build.log'}",
                file=sys.stderr,
                flush=True,
            )
            wheel = build(rec, work, jobs=args.jobs)
        if args.install:
            override = FIXTURES / "envs" / f"vllm-{rec.version}.override.txt"
            install(wheel, args.install, override if override.is_file() else None)
    except (BuildRefused, BuildFailed) as e:
        return refuse(f"build-vllm: {e}")
    print(f"harness build-vllm: {wheel}" + (f" installed into {args.install}" if args.install else ""))
    return 0


def add_parser(sub) -> None:
    """`build-vllm`."""
    b = sub.add_parser("build-vllm", help="build vLLM's CPU backend from a release's sdist (cached) and install it")
    b.add_argument("version", help="a version with a recipe in fixtures/envs/source-builds.toml (e.g. 0.34.0)")
    b.add_argument("--install", metavar="PYTHON", help="install the wheel into this interpreter's environment")
    b.add_argument("--rebuild", action="store_true", help="build even when this recipe's wheel is cached")
    b.add_argument("--workdir", help="where sources and the build venv go (default: under the build cache)")
    b.add_argument("--jobs", type=int, default=2, help="compile jobs (default 2)")
    b.set_defaults(fn=cmd_build_vllm)
