"""How big a bundle part may be: one device call carries 64 MiB together with the checkout that travels with it, and
the checkout grows (a fixed 55 MiB part stopped fitting once the tracked files passed 9 MiB)."""

from __future__ import annotations

import subprocess
from pathlib import Path

#: What one device call carries, the checkout included (MiB), and the room kept free beside a part.
CALL_MIB, MARGIN_MIB, MOST_MIB = 64, 2, 55


def travelling_mib(root: Path) -> float:
    """What of this checkout travels with every device call (tracked files and untracked ones git does not
    ignore), in MiB; 0 outside a git checkout."""
    done = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
    )
    if done.returncode:
        return 0.0
    names = [n for n in done.stdout.decode(errors="replace").split("\0") if n]
    return sum((root / n).stat().st_size for n in names if (root / n).is_file()) / 2**20


def default_part_mib(root: Path) -> int:
    """The largest part that still travels beside this checkout in one call: a call carries 64 MiB together, and
    the checkout grows (a 55 MiB part stopped fitting once the tracked files passed 9 MiB)."""
    return max(1, min(MOST_MIB, int(CALL_MIB - MARGIN_MIB - travelling_mib(root))))
