"""Released wheels of speculators and hs-connectors, unpacked (never installed) in the harness cache.

The clients (harness.clients.vllm_client) and what they declare (harness.clients.declared) read code and metadata
from a release's wheel as published: its `vllm_client.py`, its METADATA, its pinned hs-connectors' reader. Loading
by path keeps speculators 0.3.0, installed for the in-process path, untouched in the same interpreter.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from harness.support.paths import CACHE

CLIENT_FILE = "speculators/data_generation/vllm_client.py"
#: Where unpacked client wheels live (a folder of speculators-<version>-*.whl may be given instead, for a
#: machine without network: HARNESS_SPECULATORS_WHEELS).
CACHE = CACHE / "speculators-clients"


def wheel_tree(project: str, version: str) -> Path:
    """`project` `version` unpacked (not installed): from HARNESS_SPECULATORS_WHEELS if it holds the wheel, else
    downloaded once from the package index (checked against its sha256)."""
    tree = CACHE / f"{project}-{version}"
    if (tree / ".complete").is_file():
        return tree
    local = os.environ.get("HARNESS_SPECULATORS_WHEELS")
    stem = project.replace("-", "_")
    wheel = next(Path(local).glob(f"{stem}-{version}-*.whl"), None) if local else None
    CACHE.mkdir(parents=True, exist_ok=True)
    downloaded = wheel is None
    if wheel is None:
        from packaging.version import Version

        from harness.envs import sources

        found = next(
            (
                a
                for a in sources.list_files(project)
                if a.kind == "wheel" and sources.file_version(a) == Version(version)
            ),
            None,
        )
        if found is None:
            raise LookupError(f"{project} {version} has no wheel on the package index")
        wheel = sources.download(found, CACHE)  # checked against the index's sha256
    # A folder of this process's own: test workers and background runs unpack the same release side by side, and
    # the first complete tree wins (a shared ".tmp" name made the second one's rename fail, seen in CI).
    tmp = Path(tempfile.mkdtemp(prefix=f".{project}-{version}-", dir=CACHE))
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        (tmp / ".complete").write_text(wheel.name + "\n")
        try:
            os.replace(tmp, tree)
        except OSError:
            if not (tree / ".complete").is_file():  # not another process's finished tree: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if downloaded:
            wheel.unlink(missing_ok=True)  # the unpacked tree is what is used
    return tree


def client_tree(version: str) -> Path:
    return wheel_tree("speculators", version)
