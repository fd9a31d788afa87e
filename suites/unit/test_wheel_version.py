"""A wheel restamped with a dev version (harness.support.wheel_version) installs under that version: uv, the
installer, is the judge of whether its name, dist-info, METADATA and RECORD agree."""

from __future__ import annotations

import shutil
import subprocess
import zipfile

from harness.support.wheel_version import _record_hash, restamp


def _wheel(folder, name="demo_pkg", version="1.0.0"):
    info = f"{name}-{version}.dist-info/"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{name}/odd,name.py": b"",  # a comma in a path: RECORD is CSV
        info + "METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n".encode(),
        info + "WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [f'"{p}"' if "," in p else p for p in files]  # RECORD is CSV: a path with a comma is quoted
    record = (
        "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in zip(rows, files.values(), strict=True))
        + f"{info}RECORD,,\n"
    )
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in {**files, info + "RECORD": record.encode()}.items():
            z.writestr(p, d)
    return path


def test_a_restamped_wheel_installs_under_its_new_version(tmp_path):
    uv = shutil.which("uv")
    assert uv, "uv comes with tox-uv (the README's first command)"
    out = restamp(_wheel(tmp_path), "1.0.1.dev3+g0123abc", tmp_path / "dist")
    assert out.name == "demo_pkg-1.0.1.dev3+g0123abc-py3-none-any.whl"
    subprocess.run([uv, "venv", "-q", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    subprocess.run([uv, "pip", "install", "-q", "--python", python, "--offline", str(out)], check=True)
    probe = "import importlib.metadata as m, demo_pkg; print(m.version('demo-pkg'), demo_pkg.VALUE)"
    said = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert said == ["1.0.1.dev3+g0123abc", "42"]


def test_a_wheel_only_renamed_is_refused_by_the_installer(tmp_path):
    """What restamping is for: the file name alone does not make another version (the check above can fail)."""
    uv = shutil.which("uv")
    renamed = tmp_path / "demo_pkg-1.0.1.dev3-py3-none-any.whl"
    shutil.copy(_wheel(tmp_path), renamed)
    subprocess.run([uv, "venv", "-q", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    done = subprocess.run(
        [uv, "pip", "install", "-q", "--python", python, "--offline", str(renamed)], capture_output=True
    )
    assert done.returncode != 0
