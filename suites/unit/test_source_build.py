"""Building vLLM from a release's sdist (harness.envs.source_build): the recipe's edits, the oneDNN source, the
cache key, refusals in one line; and the platform plugin that picks vLLM's standalone CPU runner."""

import io
import subprocess
import sys
import tarfile

import pytest

from harness.envs import cpu_runner, source_build
from harness.envs.source_build import BuildRefused, Recipe

OLD, NEW = "VERSION_GREATER_EQUAL 12.3))", "VERSION_GREATER_EQUAL 12.2))"


def _recipe(**over) -> Recipe:
    data = {
        "sdist_sha256": "0" * 64,
        "torch": "2.14.0",
        "onednn_tag": "v3.13",
        "onednn_commit": "c" * 40,
        "gcc_min": "12.2",
        "edits": [{"file": "cmake/cpu_extension.cmake", "old": OLD, "new": NEW, "why": "w"}],
    }
    data.update(over)
    return Recipe("0.34.0", data)


def _sdist(tmp_path, text: str):
    path = tmp_path / "vllm-0.34.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        blob = text.encode()
        info = tarfile.TarInfo("vllm-0.34.0/cmake/cpu_extension.cmake")
        info.size, info.mtime = len(blob), 1_700_000_000
        tar.addfile(info, io.BytesIO(blob))
    return path


def test_every_recipe_names_what_it_changes_and_why():
    recipes = source_build.recipes()
    assert "0.34.0" in recipes
    for rec in recipes.values():
        assert len(rec.data["sdist_sha256"]) == 64 and rec.data["onednn_commit"]
        for edit in rec.edits:
            assert edit["old"] != edit["new"] and edit["why"]


def test_edits_apply_once_keep_file_times_and_refuse_when_the_text_moved(tmp_path):
    rec = _recipe()
    tree = source_build.unpack(rec, _sdist(tmp_path, f"if (GCC {OLD}\n"), tmp_path / "work")
    cmake = tree / "cmake" / "cpu_extension.cmake"
    assert cmake.read_text() == f"if (GCC {NEW}\n"
    source_build.unpack(rec, tmp_path / "vllm-0.34.0.tar.gz", tmp_path / "work")  # again: already applied, kept
    assert cmake.read_text() == f"if (GCC {NEW}\n"
    (tree / "build").mkdir()
    (tree / "build" / "obj.o").write_text("compiled")
    undone = _recipe(edits=[])  # the recipe no longer makes the edit: the tree is extracted afresh
    source_build.unpack(undone, tmp_path / "vllm-0.34.0.tar.gz", tmp_path / "work")
    assert cmake.read_text() == f"if (GCC {OLD}\n"
    assert (tree / "build" / "obj.o").read_text() == "compiled"  # compiled objects are kept across re-extraction
    assert cmake.stat().st_mtime == 1_700_000_000  # the sdist's time: ninja rebuilds only what edits touch
    moved = _recipe(sdist_sha256="1" * 64)
    with pytest.raises(BuildRefused, match="does not apply"):
        source_build.unpack(moved, _sdist(tmp_path, "if (GCC VERSION_GREATER_EQUAL 13.1))\n"), tmp_path / "w2")


def test_the_cache_key_follows_the_recipe(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_BUILD_CACHE", str(tmp_path))
    assert _recipe().key() == _recipe().key() != _recipe(torch="2.14.1").key()
    assert source_build.cached(_recipe()) is None  # nothing built: no wheel, nothing half-written looked at
    folder = tmp_path / f"vllm-0.34.0-cpu-{_recipe().key()}"
    folder.mkdir()
    (folder / "vllm-0.34.0+cpu-cp38-abi3-linux_x86_64.whl").write_bytes(b"")
    assert source_build.cached(_recipe()) is None  # a wheel without its provenance is not a finished build
    (folder / source_build.PROVENANCE).write_text("{}")
    assert source_build.cached(_recipe()).name.startswith("vllm-0.34.0")


def test_onednn_from_a_git_repository_or_a_tree_of_the_right_version(monkeypatch, tmp_path):
    repo = tmp_path / "onednn"
    repo.mkdir()
    (repo / "CMakeLists.txt").write_text("project(oneDNN VERSION 3.12.4 LANGUAGES C CXX)\n")
    monkeypatch.setenv("HARNESS_ONEDNN_SRC", str(repo))
    with pytest.raises(BuildRefused, match="is oneDNN 3.12.4, the recipe wants v3.13"):
        source_build.onednn_source(_recipe(), tmp_path / "work")
    (repo / "CMakeLists.txt").write_text("project(oneDNN VERSION 3.13.0 LANGUAGES C CXX)\n")
    src, how = source_build.onednn_source(_recipe(), tmp_path / "work")
    assert src == repo and "3.13.0" in how and str(repo) not in how
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v3.13"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setenv("HARNESS_ONEDNN_SRC", str(repo / ".git"))
    src, how = source_build.onednn_source(_recipe(onednn_commit=commit), tmp_path / "work")
    assert (src / "CMakeLists.txt").read_text().startswith("project(oneDNN VERSION 3.13.0") and commit in how
    with pytest.raises(BuildRefused, match="neither a oneDNN source tree nor a git repository holding"):
        source_build.onednn_source(_recipe(), tmp_path / "work2")  # the recipe's commit is not in that repository
    monkeypatch.delenv("HARNESS_ONEDNN_SRC")
    assert source_build.onednn_source(_recipe(), tmp_path / "work")[0] is None  # vLLM's CMake fetches it


def test_an_unknown_version_is_refused_in_one_line():
    out = subprocess.run([sys.executable, "-m", "harness", "build-vllm", "9.9.9"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "no source-build recipe for vLLM 9.9.9" in out.stderr


def test_the_runner_plugin_declines_unless_the_env_asks(monkeypatch):
    monkeypatch.delenv(cpu_runner.VARIABLE, raising=False)
    assert cpu_runner.platform() is None and "vllm" not in sys.modules.get(cpu_runner.__name__).__dict__
    with pytest.raises(AttributeError):
        cpu_runner.NotAPlatform  # noqa: B018
