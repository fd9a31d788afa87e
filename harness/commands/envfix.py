"""`envfix`: the fix-ups an installed vLLM CPU build needs, found by probing it."""

from __future__ import annotations

from harness.commands import refuse


def cmd_envfix(args) -> int:
    from harness.envs import envfix

    try:
        applied = envfix.envfix()
    except RuntimeError as e:
        return refuse(str(e))
    print("harness envfix: " + (", ".join(applied) if applied else "nothing needed"))
    return 0


def add_parser(sub) -> None:
    """`envfix`."""
    sub.add_parser("envfix", help="apply the fix-ups an installed vLLM CPU build needs (probed)").set_defaults(
        fn=cmd_envfix
    )
