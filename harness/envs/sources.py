"""One vLLM release's Python sources, fetched from the package index into a cache, never installed.

Why not `pip download`: an sdist only comes back after pip has built its metadata, and vLLM's build
needs torch, so pip fails and keeps nothing. The gate therefore asks the index the way pip does
(the simple API, PEP 691 JSON with a PEP 503 HTML fallback), downloads the release's sdist (or,
for releases without one such as 0.15.0 and 0.15.1, a wheel), checks its sha256, keeps only
`vllm/**/*.py` and deletes the archive.

Layout: `<cache>/vllm-X.Y.Z/vllm/...` where `<cache>` is `--cache-dir`, else `$HARNESS_GATE_CACHE`,
else `<repo>/.cache/gate`. A version folder appears by one rename of a finished temporary folder,
so a folder that exists is complete; a cached version needs no network.

Environment: the simple index is `HARNESS_PYPI_URL`, else the one uv or pip would use (`UV_DEFAULT_INDEX`,
`UV_INDEX_URL`, `PIP_INDEX_URL`), else https://pypi.org/simple; credentials come from the index URL's user part or
from netrc (`NETRC`, else ~/.netrc), proxies and CA bundles from the usual variables (httpx's `trust_env`);
`HARNESS_GATE_TIMEOUT` is seconds per network operation (default 60).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath

from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.support.paths import CACHE
from harness.support.progress import Progress

PROJECT = "vllm"
DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_TIMEOUT_S = 60.0
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
CHUNK = 1 << 20


class SourceError(RuntimeError):
    """The sources of a version could not be had; the gate cannot decide (UNDECIDED, exit 5)."""


class VersionNotFound(SourceError):
    """The index has no such version: bad input (exit 2), not a reading the gate could not finish."""


class UnreadableArtifact(SourceError):
    """A file given as a side is no readable vLLM source or wheel archive: bad input (exit 2)."""


#: The source errors that are the user's input, refused in one line with nothing written.
BAD_INPUT = (VersionNotFound, UnreadableArtifact)


class IndexUnreachable(SourceError):
    pass


@dataclass(frozen=True)
class Artifact:
    """One downloadable file of a release, as the index lists it."""

    filename: str
    url: str
    sha256: str | None
    size: int | None
    kind: str  # "sdist" | "wheel"


@dataclass(frozen=True)
class Sources:
    """Where a version's `vllm` package lies (`root/vllm/...`) and how it got there."""

    version: str
    root: Path
    origin: str  # "cache" or the archive it was extracted from
    provenance: dict | None = None  # where they came from (see harness.gate.obtain.artifacts)


#: Where the index comes from, first match wins: the harness's own setting, then uv's and pip's.
INDEX_VARIABLES = ("HARNESS_PYPI_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")


def index_url() -> str:
    return next((os.environ[v] for v in INDEX_VARIABLES if os.environ.get(v)), DEFAULT_INDEX).rstrip("/")


def _netrc_auth():
    """netrc credentials where a netrc file exists (httpx reads them only when asked)."""
    import httpx

    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    return httpx.NetRCAuth(path) if os.path.isfile(path) else None


class BadSetting(ValueError):
    """An environment variable the gate reads holds a value it cannot use."""


def timeout_s() -> float:
    raw = os.environ.get("HARNESS_GATE_TIMEOUT", str(DEFAULT_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise BadSetting(f"HARNESS_GATE_TIMEOUT={raw!r} is not a positive number of seconds")
    return value


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache folder, absolute: a relative `--cache-dir` or `$HARNESS_GATE_CACHE` (a workflow's `.cache/gate`)
    is taken against the working directory now, so links made into it never dangle from another folder."""
    return Path(cache_dir or os.environ.get("HARNESS_GATE_CACHE") or CACHE / "gate").expanduser().absolute()


def normalize(version: str) -> str:
    """One spelling per version: PEP 440 normal form with at least three release parts (0.17 -> 0.17.0),
    so a version has one cache entry and one report name. Anything else (a path, `../x`) is refused."""
    try:
        v = Version(version)
    except (InvalidVersion, TypeError):
        raise VersionNotFound(f"{version!r} is not a version number (expected e.g. 0.11.1)") from None
    release = ".".join(str(n) for n in (v.release + (0, 0, 0))[: max(3, len(v.release))])
    return str(v).replace(".".join(str(n) for n in v.release), release, 1)


def dev_commit(version: str) -> str | None:
    """The upstream commit a per-commit build names in its local version (`0.34.0.dev12+gabc1234.cu130` ->
    `abc1234`), None for a release."""
    local = Version(version).local or ""
    return next((part[1:] for part in local.split(".") if re.fullmatch(r"g[0-9a-f]{7,40}", part)), None)


def cached(version: str, cache_dir: str | Path | None = None) -> Path | None:
    folder = cache_root(cache_dir) / f"{PROJECT}-{normalize(version)}"
    return folder if (folder / PROJECT / "__init__.py").is_file() else None


def ensure(version: str, cache_dir: str | Path | None = None) -> Sources:
    """The sources of `version`, from the cache or fetched into it."""
    version = normalize(version)
    hit = cached(version, cache_dir)
    if hit:
        return Sources(version, hit, "cache")
    artifact = choose(version, list_files())
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    archive = download(artifact, root)
    try:
        folder = extract(archive, artifact, root, f"{PROJECT}-{version}")
    finally:
        archive.unlink(missing_ok=True)
    return Sources(version, folder, artifact.filename)


# -- the index ---------------------------------------------------------------------------------------
class _Body:
    """A streamed response as the readers below use it: `headers`, and `read(n)` (a chunk, b"" at the end)."""

    def __init__(self, response) -> None:
        self.headers = response.headers
        self._chunks = response.iter_bytes(CHUNK)

    def read(self, size: int | None = None) -> bytes:
        if size is None:
            return b"".join(self._chunks)
        return next(self._chunks, b"")


@contextmanager
def _open(url: str, accept: str | None = None):
    import httpx

    try:
        with (
            httpx.Client(timeout=timeout_s(), follow_redirects=True, trust_env=True, auth=_netrc_auth()) as client,
            client.stream("GET", url, headers={"Accept": accept} if accept else {}) as resp,
        ):
            if resp.status_code == 404:
                raise VersionNotFound(f"{url} does not exist (HTTP 404)")
            if resp.status_code >= 400:
                raise IndexUnreachable(f"{url} answered HTTP {resp.status_code} {resp.reason_phrase}")
            yield _Body(resp)
    except (httpx.TransportError, httpx.DecodingError, httpx.InvalidURL) as exc:
        raise IndexUnreachable(
            f"cannot reach the package index at {url}: {exc}. The gate needs the network the first time "
            f"it reads a vLLM version (cached versions need none); set HARNESS_PYPI_URL for another index."
        ) from None


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            a = dict(attrs)
            if a.get("href"):
                self.links.append(a)


def list_files(project: str = PROJECT) -> list[Artifact]:
    """Every file the index lists for a project (default vLLM; all versions)."""
    return list_page(f"{index_url()}/{project}/")


def list_page(page: str) -> list[Artifact]:
    """Every wheel and sdist a simple-API page lists (PEP 691 JSON, else PEP 503 HTML), links made absolute."""
    with _open(page, ACCEPT) as resp:
        ctype = resp.headers.get("Content-Type", "")
        body = resp.read()
    if "json" in ctype:
        entries = [
            (f["filename"], f["url"], (f.get("hashes") or {}).get("sha256"), f.get("size"))
            for f in json.loads(body).get("files", [])
        ]
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        entries = []
        for a in parser.links:
            url, _, fragment = a["href"].partition("#")
            sha = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None
            entries.append((urllib.parse.unquote(PurePosixPath(urllib.parse.urlparse(url).path).name), url, sha, None))
    found = (_artifact(name, urllib.parse.urljoin(page, url), sha, size) for name, url, sha, size in entries)
    return [a for a in found if a is not None]


def _artifact(filename: str, url: str, sha: str | None, size: int | None) -> Artifact | None:
    kind = "wheel" if filename.endswith(".whl") else "sdist" if filename.endswith((".tar.gz", ".zip")) else None
    return Artifact(filename, url, sha, size, kind) if kind else None


def file_version(artifact: Artifact) -> Version | None:
    try:
        if artifact.kind == "wheel":
            return parse_wheel_filename(artifact.filename)[1]
        return parse_sdist_filename(artifact.filename)[1]
    except (InvalidSdistFilename, InvalidWheelFilename, InvalidVersion):
        return None


def choose(version: str, files: list[Artifact]) -> Artifact:
    """The sdist of `version`, else its smallest wheel (every wheel holds the same Python files)."""
    wanted = Version(version)
    mine = [f for f in files if file_version(f) == wanted]
    if not mine:
        known = sorted({v for v in map(file_version, files) if v is not None and not v.is_prerelease})
        newest = ", ".join(str(v) for v in known[-3:]) or "none"
        raise VersionNotFound(f"vLLM {version} is not on the package index {index_url()} (newest releases: {newest})")
    sdists = [f for f in mine if f.kind == "sdist"]
    if sdists:
        return sdists[0]
    return min(mine, key=lambda f: f.size if f.size is not None else float("inf"))


# -- download and extraction -------------------------------------------------------------------------
def download(artifact: Artifact, root: Path) -> Path:
    return download_hashed(artifact, root)[0]


def download_hashed(artifact: Artifact, root: Path) -> tuple[Path, str]:
    """The artifact in a temporary file under `root`, checked against the index's sha256 where it gives one,
    and the file's sha256 (computed while it arrives)."""
    fd, name = tempfile.mkstemp(prefix=f".{artifact.filename}.", suffix=".part", dir=root)
    path = Path(name)
    digest = hashlib.sha256()
    progress = Progress(f"gate: downloading {artifact.filename}", artifact.size)
    try:
        with os.fdopen(fd, "wb") as out, _open(artifact.url) as resp:
            while chunk := resp.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                progress.advance(len(chunk))
        progress.finish()
    except SourceError:
        path.unlink(missing_ok=True)
        raise
    except OSError as exc:  # the local file
        path.unlink(missing_ok=True)
        raise SourceError(f"writing {path} failed: {exc}") from None
    if artifact.sha256 and digest.hexdigest() != artifact.sha256:
        path.unlink(missing_ok=True)
        raise SourceError(
            f"{artifact.filename}: sha256 {digest.hexdigest()} does not match the index's {artifact.sha256}"
        )
    return path, digest.hexdigest()


SDIST_MEMBER = re.compile(r"^[^/]+/(vllm/.+\.py)$")
WHEEL_MEMBER = re.compile(r"^(vllm/.+\.py)$")


def _safe(relative: str) -> bool:
    parts = PurePosixPath(relative).parts
    return bool(parts) and ".." not in parts and not PurePosixPath(relative).is_absolute()


def _members(archive: Path, artifact: Artifact):
    """(relative path, bytes) of every vllm/**/*.py in the archive."""
    if artifact.kind == "wheel" or artifact.filename.endswith(".zip"):
        pattern = WHEEL_MEMBER if artifact.kind == "wheel" else SDIST_MEMBER
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                m = pattern.match(info.filename)
                if m and not info.is_dir():
                    yield m.group(1), z.read(info)
        return
    with tarfile.open(archive, "r:*") as t:
        for member in t:
            m = SDIST_MEMBER.match(member.name)
            handle = t.extractfile(member) if m and member.isfile() else None
            if m and handle is not None:
                yield m.group(1), handle.read()


def extract(archive: Path, artifact: Artifact, root: Path, name: str) -> Path:
    """The archive's vllm/**/*.py as the cache folder `root/name`, which appears complete or not at all."""
    final = root / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
    try:
        count = 0
        try:
            for relative, data in _members(archive, artifact):
                if not _safe(relative):
                    continue
                target = tmp / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                count += 1
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
            raise UnreadableArtifact(f"{artifact.filename} could not be read: {exc}") from None
        if not (tmp / PROJECT / "__init__.py").is_file():
            raise UnreadableArtifact(f"{artifact.filename} holds no vllm/__init__.py ({count} Python files)")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / PROJECT / "__init__.py").is_file():
                raise
            shutil.rmtree(tmp)  # another process finished the same version first
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
