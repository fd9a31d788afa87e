"""The gate judges any build a user can point at: a wheel, an sdist, a source folder, a wheel URL, an index page
laid out as vLLM's per-commit wheel index, served on 127.0.0.1. All of them carry the same fabricated build (the
0.32.0 sources with one contract changed: `Scheduler(structured_output_manager=)` renamed), so each must produce
the same finding, and each report must say where its sources came from.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import json
import shutil
import subprocess
import tarfile
import threading
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from harness.envs import sources
from harness.gate.cli import configure, run
from harness.gate.obtain import artifacts

VERSION = "0.33.0.dev5+gabc1234d"  # a per-commit build: dev release, commit in the local version
COMMIT = "abc1234d" + "0" * 32
WHEEL = f"vllm-{VERSION}.cpu-cp38-abi3-manylinux1_x86_64.whl"
SDIST = f"vllm-{VERSION}.tar.gz"
CHANGED = (
    "vllm/v1/core/sched/scheduler.py",
    "structured_output_manager: StructuredOutputManager,",
    "structured_outputs: StructuredOutputManager,",
)


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> dict:
    """The fabricated build as a source folder (a git checkout), a wheel, an sdist and a served index."""
    base = sources.ensure("0.32.0").root
    tmp = tmp_path_factory.mktemp("artifacts")
    tree = tmp / "vllm-checkout"
    shutil.copytree(base / "vllm", tree / "vllm")
    path, old, new = CHANGED
    text = (tree / path).read_text()
    assert old in text, "the 0.32.0 sources no longer hold the line this test changes"
    (tree / path).write_text(text.replace(old, new, 1))
    (tree / "vllm" / "_version.py").write_text(f"__version__ = version = '{VERSION}'\n")
    git = shutil.which("git")
    if git:
        for cmd in (
            ["init", "-q"],
            ["add", "-A"],
            ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "fab"],
        ):
            subprocess.run([git, "-C", str(tree), *cmd], check=True, capture_output=True)
    files = sorted(p for p in (tree / "vllm").rglob("*.py"))
    site = tmp / "site"
    commit_dir = site / COMMIT
    commit_dir.mkdir(parents=True)
    wheel = commit_dir / WHEEL
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            z.write(f, f.relative_to(tree).as_posix())
        z.writestr(f"vllm-{VERSION}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n")
    sdist = tmp / SDIST
    with tarfile.open(sdist, "w:gz") as t:
        for f in files:
            t.add(f, f"vllm-{VERSION}/{f.relative_to(tree).as_posix()}")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    quoted = urllib.parse.quote(WHEEL, safe="")
    # vLLM's per-commit layout: <commit>/<wheel>, <commit>/cpu/vllm/{index.html,metadata.json}, nightly/cpu/vllm/.
    for folder, up in ((commit_dir / "cpu", "../../"), (site / "nightly" / "cpu", f"../../../{COMMIT}/")):
        (folder / "vllm").mkdir(parents=True)
        (folder / "index.html").write_text('<html><body><a href="vllm/">vllm/</a></body></html>')
        (folder / "vllm" / "index.html").write_text(
            f'<!DOCTYPE html><html><body><a href="{up}{quoted}#sha256={sha}">{WHEEL}</a><br/></body></html>'
        )
        (folder / "vllm" / "metadata.json").write_text(
            json.dumps(
                [
                    {
                        "package_name": "vllm",
                        "version": VERSION,
                        "variant": "cpu",
                        "filename": WHEEL,
                        "path": f"{up}{quoted}",
                    }
                ]
            )
        )
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield {"tree": tree, "wheel": wheel, "sdist": sdist, "sha": sha, "url": url, "git": bool(git)}
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output to the test's own lines
        pass


def _gate(tmp_path, cache: Path, to: str) -> tuple[int, dict]:
    out = tmp_path / "gate.json"
    args = configure(argparse.ArgumentParser()).parse_args(
        [
            "--from",
            "0.32.0",
            "--to",
            to,
            "--cache-dir",
            str(cache),
            "--json",
            str(out),
            "--summary",
            str(tmp_path / "gate.md"),
        ]
    )
    return run(args), json.loads(out.read_text())


def _the_finding(rep: dict) -> list[tuple]:
    return sorted((f["contract"], f["kind"], f["symbol"]) for f in rep["findings"] if f["contract"] == "sched")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A cache of its own: 0.32.0 copied in from the shared one, the fabricated build's folders new each run."""
    root = tmp_path_factory.mktemp("gate-cache")
    shutil.copytree(sources.ensure("0.32.0").root, root / "vllm-0.32.0")
    return root


@pytest.mark.parametrize("kind", ["tree", "wheel", "sdist", "url-wheel", "index-commit", "index-nightly"])
def test_every_artifact_kind_gives_the_same_finding_with_its_provenance(kind, build, cache, tmp_path):
    to = {
        "tree": str(build["tree"]),
        "wheel": str(build["wheel"]),
        "sdist": str(build["sdist"]),
        "url-wheel": f"{build['url']}/{COMMIT}/{urllib.parse.quote(WHEEL)}",
        "index-commit": f"{build['url']}/{COMMIT}/cpu/",
        "index-nightly": f"{build['url']}/nightly/cpu/vllm/",
    }[kind]
    rc, rep = _gate(tmp_path, cache, to)
    found = _the_finding(rep)
    assert ("sched", "keyword-removed", "vllm.v1.core.sched.scheduler:Scheduler(structured_output_manager=)") in found
    assert rc == 1 and rep["verdict"] != "SAFE", rep["verdict"]
    version = sources.normalize(VERSION + (".cpu" if kind not in ("tree", "sdist") else ""))  # the wheel's own
    assert rep["to"] == version
    prov = rep["sources"]["to"]
    assert prov["version"] == version
    if kind == "tree":
        assert prov["kind"] == "tree" and prov["origin"] == "source folder vllm-checkout"
        assert prov["commit"] == (_git_head(build["tree"]) if build["git"] else "abc1234d")
    else:
        assert prov["sha256"] == (
            hashlib.sha256(Path(to).read_bytes()).hexdigest() if kind in ("wheel", "sdist") else build["sha"]
        )
        assert prov["commit"] == "abc1234d"
    if kind.startswith("index"):
        assert prov["kind"] == "index" and prov["variant"] == "cpu" and prov["file"] == WHEEL
    assert rep["sources"]["from"]["version"] == "0.32.0"
    assert str(build["tree"].parent) not in json.dumps(rep), "a machine path in the gate report"


def test_reports_of_different_builds_of_one_version_never_share_a_name():
    """Three builds that all say the same version (a tree at two commits, a wheel) get three report names."""
    from harness.gate.cli import report_path

    tree = {"from": {"kind": "version"}, "to": {"kind": "tree", "commit": "1a2b3c4d5e"}}
    other = {"from": {"kind": "version"}, "to": {"kind": "tree", "commit": "99aa88bb77"}}
    wheel = {"from": {"kind": "version"}, "to": {"kind": "wheel", "sha256": "deadbeef" * 8}}
    names = {report_path("0.32.0", "0.34.0", s).name for s in (tree, other, wheel)}
    assert names == {
        "gate-0.32.0-to-0.34.0+tree-1a2b3c4d.json",
        "gate-0.32.0-to-0.34.0+tree-99aa88bb.json",
        "gate-0.32.0-to-0.34.0+wheel-deadbeef.json",
    }
    assert (
        report_path("0.32.0", "0.34.0", {"from": {"kind": "version"}, "to": {"kind": "version"}}).name
        == "gate-0.32.0-to-0.34.0.json"
    )


def _git_head(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize(
    "raw,says",
    [
        ("does-not-exist.whl", "no such file"),
        ("notes.txt", "not a version number"),
        ("http://", "not a URL"),
    ],
)
def test_an_artifact_that_is_none_of_the_forms_is_refused_before_any_download(raw, says, tmp_path):
    with pytest.raises(sources.VersionNotFound, match=says):
        artifacts.parse(raw)


def test_a_folder_that_is_not_a_vllm_tree_is_refused(tmp_path):
    with pytest.raises(sources.VersionNotFound, match="not a vLLM source tree"):
        artifacts.parse(str(tmp_path))


def test_a_tree_is_named_by_its_content(tmp_path):
    """Two folders that both say 0.33.0 get different report names unless their sources are the same."""
    from harness.gate.cli import report_path
    from harness.gate.obtain.artifacts import fetch, parse

    def tree(name: str, body: str) -> Path:
        root = tmp_path / name
        (root / "vllm").mkdir(parents=True)
        (root / "vllm" / "__init__.py").write_text("")
        (root / "vllm" / "_version.py").write_text("__version__ = version = '0.33.0'\n")
        (root / "vllm" / "core.py").write_text(body)
        return root

    got = [fetch(parse(str(tree(n, b)))) for n, b in (("a", "x = 1\n"), ("b", "x = 2\n"), ("c", "x = 1\n"))]
    names = [report_path("0.33.0", g.version, {"from": {"kind": "version"}, "to": g.provenance}).name for g in got]
    assert names[0] != names[1] and names[0] == names[2], names
    assert names[0].startswith("gate-0.33.0-to-") and "+tree-" in names[0]
