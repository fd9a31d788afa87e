"""The commands of `python -m harness`, one module per job, each declaring its subcommands' arguments next to
the function that runs them; `harness.cli` builds the parser from them and turns what a command raises into the
exit codes every command shares."""

from __future__ import annotations

import sys


def refuse(message: str) -> int:
    """The command cannot run (bad input, a missing piece): one line on stderr, exit 2."""
    print(f"harness: {message}", file=sys.stderr)
    return 2
