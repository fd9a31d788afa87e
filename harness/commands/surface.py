"""`surface`: the vLLM surface speculators uses, or the harness's own shims use, read from their code."""

from __future__ import annotations

import json
from pathlib import Path

from harness.commands import refuse
from harness.support.paths import CHECKOUT, REPO_ROOT


def cmd_surface(args) -> int:
    from harness.installed import surface

    if args.shims:
        from harness.vllm_source import shim_surface

        if not CHECKOUT:
            return refuse("surface --shims rewrites a checkout's fixtures/surfaces; this harness is installed")

        print(f"harness surface: wrote {shim_surface.write().relative_to(REPO_ROOT)}")
        return 0
    data = surface.dump(Path(args.out)) if args.out else {m: surface.parse(m).to_json() for m in surface.CLIENT_MODULES}
    if not args.out:
        print(json.dumps(data, indent=2))
    return 0


def add_parser(sub) -> None:
    """`surface`."""
    s = sub.add_parser("surface", help="speculators' used vLLM surface, from its installed source (AST)")
    s.add_argument("--out", help="write speculators' surface to this file instead of printing it")
    s.add_argument(
        "--shims",
        action="store_true",
        help="rewrite fixtures/surfaces/harness-shims.json: the vLLM surface "
        "of the harness's own shims, from their code (AST)",
    )
    s.set_defaults(fn=cmd_surface)
