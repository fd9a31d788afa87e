"""Where the repository's data lives, resolved from this file so it works from any working directory."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "fixtures"
REPORTS = REPO_ROOT / "reports"
