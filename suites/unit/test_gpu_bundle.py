"""The GPU bundle builder's offline steps: fat-binary pruning, packing into parts, wheels without static
libraries, and the installer that stages parts in any order (harness.gpu.bundle; the download and resolve steps
need the package index and run where a bundle is built)."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from harness.gpu import bundle, fatbin


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def _container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, len(body)) + body


def _elf(section: bytes) -> bytes:
    """A minimal ELF64 file: header, a `.nv_fatbin` section holding `section`, the section-name table."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_at = 64
    names_at = data_at + len(section)
    shoff = names_at + len(names)
    shoff += (-shoff) % 8
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)

    def sh(name: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQ", name, 1, 0, 0, offset, size) + bytes(24)

    body = bytes(header) + section + names
    body += bytes(shoff - len(body))
    return body + bytes(64) + sh(1, names_at, len(names)) + sh(11, data_at, len(section))


def test_prune_keeps_the_architecture_s_code_and_the_ptx_a_container_without_it_needs(tmp_path):
    sm90, sm80, ptx80 = b"\x90" * 40, b"\x80" * 48, b"\x08" * 32
    so = tmp_path / "_C.abi3.so"
    so.write_bytes(
        _elf(
            _container(_entry(fatbin.ELF, 80, sm80), _entry(fatbin.ELF, 90, sm90))
            + _container(_entry(fatbin.ELF, 80, sm80), _entry(fatbin.PTX, 80, ptx80))
        )
    )
    before = so.read_bytes()
    zeroed, kept = fatbin.prune(so, 90)
    after = so.read_bytes()
    assert (zeroed, kept) == (len(sm80) * 2, 2) and len(after) == len(before)
    assert sm90 in after and ptx80 in after and sm80 not in after
    assert [[(e.kind, e.arch) for e in c] for c in fatbin.containers(after)] == [[(2, 80), (2, 90)], [(2, 80), (1, 80)]]
    plain = tmp_path / "plain.so"
    plain.write_bytes(b"\x7fELF\x02" + bytes(100))
    assert fatbin.prune(plain) == (0, 0) and plain.read_bytes() == b"\x7fELF\x02" + bytes(100)


def test_pack_spreads_files_over_parts_under_the_limit_and_splits_what_is_larger(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    sizes = {"big.tar.xz": 250, "a.whl": 60, "b.whl": 50, "c.whl": 30}
    for name, size in sizes.items():
        (src / name).write_bytes(os.urandom(size))
    whole = (src / "big.tar.xz").read_bytes()
    out = tmp_path / "out"
    out.mkdir()
    parts = bundle.pack(sorted(src.iterdir()), out, 100)
    assert all(sum((out / f"part{k}" / n).stat().st_size for n in names) <= 100 for k, names in enumerate(parts, 1))
    pieces = sorted((p for p in out.rglob("big.tar.xz.*")), key=lambda p: p.name)
    assert [p.name for p in pieces] == ["big.tar.xz.000", "big.tar.xz.001", "big.tar.xz.002"]
    assert b"".join(p.read_bytes() for p in pieces) == whole
    assert sorted(n for names in parts for n in names) == sorted(["a.whl", "b.whl", "c.whl", *(p.name for p in pieces)])


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    dist = path.name.split("-")[0] + "-" + path.name.split("-")[1] + ".dist-info"
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: toy\nVersion: 1.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", record)
    return path


def test_a_wheel_loses_its_static_libraries_and_their_record_rows(tmp_path):
    src = _wheel(tmp_path / "toy-1.0-py3-none-any.whl", {"toy/__init__.py": b"X = 1\n", "toy/lib/libtoy.a": b"!" * 99})
    (tmp_path / "out").mkdir()
    assert bundle.slim_wheel(src, tmp_path / "out") == ["toy/lib/libtoy.a"]
    with zipfile.ZipFile(tmp_path / "out" / src.name) as z:
        assert "toy/lib/libtoy.a" not in z.namelist() and "libtoy.a" not in z.read("toy-1.0.dist-info/RECORD").decode()


def _part(folder: Path, files: dict[str, bytes], manifest: dict) -> None:
    import hashlib

    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in files.items()))
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))
    (folder / "install.sh").write_bytes(bundle.INSTALLER.read_bytes())


def test_the_installer_waits_for_every_part_then_installs_and_imports_the_bundle_s_vllm(tmp_path):
    """Two parts, the second first: the first call stages (exit 10), the last installs the wheel and the tree
    into SITE and imports `vllm` from there (a stand-in package of that name, as the real tree is)."""
    import hashlib

    tree = io.BytesIO()
    with tarfile.open(fileobj=tree, mode="w:xz") as tar:
        data = b"__version__ = '9.9.9'\n"
        info = tarfile.TarInfo("vllm/__init__.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive = tree.getvalue()
    whl = _wheel(tmp_path / "toy-1.0-py3-none-any.whl", {"toy/__init__.py": b"X = 1\n"}).read_bytes()
    half = len(archive) // 2
    files = {"vllm.tar.xz.000": archive[:half], "vllm.tar.xz.001": archive[half:], "toy-1.0-py3-none-any.whl": whl}
    manifest = {
        "vllm": "9.9.9",
        "arch": "sm_90",
        "archive": "vllm.tar.xz",
        "archive_sha256": hashlib.sha256(archive).hexdigest(),
        "parts": {"part1": ["vllm.tar.xz.000"], "part2": ["toy-1.0-py3-none-any.whl", "vllm.tar.xz.001"]},
        "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()},
    }
    _part(tmp_path / "b" / "part1", {"vllm.tar.xz.000": files["vllm.tar.xz.000"]}, manifest)
    _part(tmp_path / "b" / "part2", {n: files[n] for n in manifest["parts"]["part2"]}, manifest)
    env = dict(os.environ, PY=sys.executable, SITE=str(tmp_path / "site"), STAGE=str(tmp_path / "stage"))

    def install(part: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(tmp_path / "b" / part / "install.sh")], env=env, capture_output=True, text=True, timeout=120
        )

    first = install("part2")
    assert first.returncode == 10 and "waiting for part1" in first.stdout, first.stderr
    done = install("part1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "vllm" / "__init__.py").is_file() and (tmp_path / "site" / "toy").is_dir()
    assert install("part2").returncode == 0  # already installed: nothing to do
    (tmp_path / "b" / "part1" / "vllm.tar.xz.000").write_bytes(b"changed")
    assert install("part1").returncode == 1  # a part that does not match its checksums is refused


def test_a_release_that_does_not_pin_the_device_s_torch_is_refused_in_one_line():
    assert bundle.torch_pin(["regex", "torch==2.13.0", "torchvision==0.28.0"]) == "2.13.0"
    assert bundle.torch_pin(['torch==2.11.0; extra == "x"']) is None
    assert bundle.main(["latest"]) == 2


def test_the_downloader_runs_from_a_uv_venv_that_has_no_pip(tmp_path):
    """A `uv venv` (what docs/getting-started.md creates) has no pip: the builder runs pip through uv there, and
    the command it picks answers."""
    import shutil

    uv = shutil.which("uv")
    assert uv, "uv is installed with tox-uv, the README's first command"
    subprocess.run([uv, "venv", "-q", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    probe = "import json; from harness.gpu import bundle; print(json.dumps(bundle.pip_command()))"
    root = Path(bundle.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True, env=env)
    cmd = json.loads(out.stdout)
    assert cmd[:3] == ["uv", "tool", "run"], cmd
    said = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=300)
    assert said.returncode == 0 and said.stdout.startswith("pip "), said.stderr


def test_the_default_part_travels_beside_this_checkout_in_one_call():
    """A device call carries 64 MiB with the checkout: the default part is sized from what this checkout sends (a fixed
    55 MiB part stopped fitting once the tracked files passed 9 MiB), never above 55 MiB."""
    from harness.gpu import call_room
    from harness.support.paths import REPO_ROOT

    sent = call_room.travelling_mib(REPO_ROOT)
    part = call_room.default_part_mib(REPO_ROOT)
    assert sent > 1, "the checkout's tracked files are counted"
    assert part + sent <= call_room.CALL_MIB - 1 and 1 <= part <= call_room.MOST_MIB, (part, sent)
