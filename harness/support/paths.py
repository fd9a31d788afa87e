"""Where the harness's data is read from and where its outputs go, from a source checkout or an installed wheel.

In a checkout (fixtures/ beside the package) everything stays in the tree, as the suites and tox expect: reads
from fixtures/, reports to reports/, caches under .cache/. Installed, the fixtures ship inside the package
(`harness/_fixtures`, package data) and outputs go under the working directory (`./reports`, `./.cache`), never
into site-packages.
"""

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # harness/, this file being harness/support/paths.py
#: the folder that holds the `harness` package (the checkout, or site-packages): what a child's PYTHONPATH needs
SOURCE_ROOT = PACKAGE.parent
#: True when running from a source checkout
CHECKOUT = (SOURCE_ROOT / "fixtures" / "envs" / "matrix.toml").is_file()
#: the checkout; installed, the working directory (outputs are relative to it)
REPO_ROOT = SOURCE_ROOT if CHECKOUT else Path.cwd()
FIXTURES = SOURCE_ROOT / "fixtures" if CHECKOUT else PACKAGE / "_fixtures"
REPORTS = REPO_ROOT / "reports"
CACHE = REPO_ROOT / ".cache"
#: What the suites' paths are relative to: the checkout, or, installed, the package (the wheel ships suites/ as
#: harness/suites, so a test's id reads `suites/e2e/...` either way and the suites' conftest is a top-level one).
SUITES_BASE = SOURCE_ROOT if CHECKOUT else PACKAGE
#: The suites a complete run covers, per kind, in the order a CPU run takes them (relative to SUITES_BASE).
SUITES = {
    "cpu": ("suites/contracts", "suites/e2e", "suites/native", "suites/clients", "suites/bad_input"),
    "gpu": ("suites/gpu",),
}
