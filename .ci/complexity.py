"""No function above cyclomatic complexity 20 without its reason beside it (tox -e lint).

    python .ci/complexity.py harness benchmarks

Complexity is radon's (McCabe's count, with each boolean operator, comprehension and `if` expression counted: the
measure the project's complexity figures are given in). A function that must stay above the limit carries
`# complexity: <why>` on its `def` line; anything else above it is listed and the check fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

from radon.complexity import cc_visit

LIMIT = 20
REASON = "# complexity:"


def over_limit(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for block in cc_visit(text):
        for b in [block, *getattr(block, "methods", [])]:
            if b.complexity > LIMIT and REASON not in lines[b.lineno - 1]:
                found.append(f"{path}:{b.lineno} {b.fullname if hasattr(b, 'fullname') else b.name} {b.complexity}")
    return found


def main(roots: list[str]) -> int:
    found = [f for root in roots for p in sorted(Path(root).rglob("*.py")) for f in over_limit(p)]
    for f in found:
        print(f"{f} > {LIMIT}: split it into named steps, or say why not with `{REASON} <why>` on its def line")
    print(f"complexity: {len(found)} function(s) above {LIMIT} without a reason")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["harness"]))
