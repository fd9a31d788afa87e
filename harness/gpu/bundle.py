"""Build an offline vLLM bundle for the GPU machine from the package index, in one command.

The GPU machine has Python 3.12 and torch (2.11.0+cu130) but no vLLM and no network, and one call carries at most
64 MiB. A vLLM CUDA wheel is 250-600 MB, most of it device code for every GPU generation. So:

    python -m harness.gpu.bundle 0.22.0 [--out build/gpu-bundle] [--arch 90] [--torch 2.11.0]

1. downloads vLLM's cp312 manylinux wheel and refuses (exit 2) a release whose torch pin is not the device's;
2. resolves its dependencies for Python 3.12 on x86-64 Linux with nothing newer than 14 days after the wheel was
   built (`uv pip compile --exclude-newer`), so the same command gives the same versions next year, and downloads
   those the device's image lacks (`DEVICE_HAS`, its package list) except the optional kernel packages of `OPTIONAL`
   (vLLM runs without them on the backends the GPU tier selects; each says why);
3. leaves the static libraries (`*.a`) out of the dependency wheels, and makes a slim vLLM tree: the wheel unpacked,
   the optional extensions of `REMOVE` left out, and every other extension's fat binaries cut to the one
   architecture (`harness.gpu.fatbin`); RECORD rewritten to match;
4. packs the dependency wheels and the tree (tar, xz) into parts of at most `--part-mib` MiB (the archive split
   into pieces where it must), each with its checksums, the bundle's manifest and one installer. Any part may
   arrive first: `bash partK/install.sh` stages it (exit 10 while parts are missing) and, once all are there,
   installs everything into $SITE (default /tmp/site) and imports vLLM from it (exit 0).

`DEVICE_HAS`, `OPTIONAL`, `REMOVE` and the wheel platforms are in `harness.gpu.bundle_contents`. Nothing is
committed: the bundle goes to `--out` (ignored), wheels to the cache. Re-running with the same inputs
gives byte-identical parts (sorted tar members, fixed owners and times, single-threaded xz).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from harness.gpu import fatbin
from harness.gpu.bundle_contents import DEVICE_HAS, OPTIONAL, PLATFORMS, REMOVE
from harness.gpu.call_room import default_part_mib

NEWER_DAYS = 14
INSTALLER = Path(__file__).with_name("bundle_install.sh")


class Refused(Exception):
    """Bad input: one line for the user, exit 2."""


def _run(cmd: list[str], **kw) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise Refused(f"{cmd[0]} {' '.join(cmd[1:3])} failed: {said[-1] if said else f'exit {done.returncode}'}")
    return done.stdout


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_command() -> list[str]:
    """How to run pip here: this interpreter's own where it has one, else pip run by uv in an isolated env (a
    `uv venv` has no pip, and uv has no `pip download`). `pip download` with an explicit platform and Python
    version does not depend on the interpreter that runs it."""
    import importlib.util

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    if shutil.which("uv"):
        return ["uv", "tool", "run", "--quiet", "pip"]
    raise Refused("neither pip in this Python nor uv on PATH: `pip download` is how the bundle gets its wheels")


def download(spec: list[str], dest: Path) -> None:
    """`pip download --no-deps` of exact pins for the device's interpreter and platform."""
    dest.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    _run(
        [
            *pip_command(),
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *plat,
            "-d",
            str(dest),
            *spec,
        ]
    )


def wheel_file(dest: Path, name: str, version: str) -> Path:
    stem = f"{name.replace('-', '_')}-{version}-"
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(stem.lower())]
    if not found:
        raise Refused(f"no wheel of {name} {version} in {dest}")
    return sorted(found)[0]


def metadata(whl: Path) -> tuple[str, list[str], dt.datetime]:
    """(version, Requires-Dist lines, newest member time) of a wheel."""
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
        newest = max(dt.datetime(*i.date_time) for i in z.infolist())
    found = re.search(r"^Version: (\S+)", text, re.M)
    if found is None:
        raise ValueError(f"{whl.name}: no Version in its METADATA")
    return found.group(1), re.findall(r"^Requires-Dist: (.+)$", text, re.M), newest


def torch_pin(requires: list[str]) -> str | None:
    for line in requires:
        m = re.match(r"torch\s*==\s*([\w.+]+)\s*(;.*)?$", line)
        if m and "extra" not in (m.group(2) or ""):
            return m.group(1)
    return None


def resolve(version: str, before: dt.date, work: Path) -> dict[str, str]:
    """vLLM's dependency closure for CPython 3.12 on x86-64 Linux, nothing published after `before`."""
    req = work / "vllm.in"
    req.write_text(f"vllm=={version}\n")
    out = _run(
        [
            "uv",
            "pip",
            "compile",
            str(req),
            "--python-version",
            "3.12",
            "--python-platform",
            "x86_64-manylinux_2_28",
            "--exclude-newer",
            before.isoformat(),
            "--no-header",
            "--no-annotate",
            "-q",
            "--index-url",
            os.environ.get("HARNESS_BUNDLE_INDEX", "https://pypi.org/simple"),
        ]
    )
    pins = {}
    for line in out.splitlines():
        m = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line.strip())
        if m:
            pins[_norm(m.group(1))] = m.group(2)
    return pins


def slim_wheel(src: Path, dest: Path) -> list[str]:
    """Copy a wheel into `dest`, without the static libraries (`*.a`) some ship beside their shared ones (xgrammar:
    65 MB): nothing imports them at run time. Returns what was left out."""
    out = dest / src.name
    with zipfile.ZipFile(src) as z:
        dropped = [i.filename for i in z.infolist() if i.filename.endswith(".a")]
        if not dropped:
            shutil.copy2(src, out)
            return []
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as w:
            for info in z.infolist():
                if info.filename in dropped:
                    continue
                data = z.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    rows = data.decode().splitlines()
                    data = ("\n".join(r for r in rows if r.split(",")[0] not in dropped) + "\n").encode()
                w.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return dropped


def carried(pins: dict[str, str]) -> dict[str, str]:
    return {n: v for n, v in sorted(pins.items()) if n != "vllm" and n not in DEVICE_HAS and n not in OPTIONAL}


def slim_tree(whl: Path, tree: Path, arch: int) -> dict:
    """Unpack the wheel into `tree`, drop REMOVE, cut fat binaries to `arch`, rewrite RECORD."""
    shutil.rmtree(tree, ignore_errors=True)
    with zipfile.ZipFile(whl) as z:
        z.extractall(tree)
    removed = []
    for rel in REMOVE:
        path = tree / rel
        if path.is_dir():
            removed += sorted(str(p.relative_to(tree)) for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
        elif path.exists():
            removed.append(rel)
            path.unlink()
    pruned = {}
    for so in sorted(tree.rglob("*.so")):
        zeroed, kept = fatbin.prune(so, arch)
        if zeroed:
            pruned[str(so.relative_to(tree))] = {"zeroed_bytes": zeroed, "entries_kept": kept}
    record = next(tree.glob("*.dist-info/RECORD"))
    rows = []
    for line in record.read_text().splitlines():
        rel = line.split(",")[0]
        path = tree / rel
        if not path.exists():
            continue
        if path == record:
            rows.append(f"{rel},,")
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{path.stat().st_size}")
    record.write_text("\n".join(rows) + "\n")
    return {"removed": removed, "pruned": pruned}


def archive(tree: Path, dest: Path) -> None:
    """tar.xz of the tree, reproducible: sorted members, owner 0, fixed times, one xz thread."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    filters = [
        {"id": lzma.FILTER_X86},
        {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": 256 << 20},
    ]
    with (
        lzma.open(dest, "wb", format=lzma.FORMAT_XZ, filters=filters) as xz,
        tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(tree)), filter=clean)


def pack(files: list[Path], out: Path, limit: int) -> list[list[str]]:
    """Spread the files over parts of at most `limit` bytes, largest first; a file over the limit is split into
    pieces (`NAME.000`, ...). Returns each part's file names."""
    pieces: list[Path] = []
    for f in files:
        if f.stat().st_size <= limit:
            pieces.append(f)
            continue
        data = f.read_bytes()
        for i in range(0, len(data), limit):
            piece = f.with_name(f"{f.name}.{i // limit:03d}")
            piece.write_bytes(data[i : i + limit])
            pieces.append(piece)
        f.unlink()
    parts: list[list[Path]] = []
    sizes: list[int] = []
    for f in sorted(pieces, key=lambda p: (-p.stat().st_size, p.name)):
        size = f.stat().st_size
        for i, used in enumerate(sizes):
            if used + size <= limit:
                parts[i].append(f)
                sizes[i] += size
                break
        else:
            parts.append([f])
            sizes.append(size)
    for k, names in enumerate(parts, 1):
        folder = out / f"part{k}"
        folder.mkdir()
        for f in names:
            shutil.move(str(f), folder / f.name)
    return [sorted(f.name for f in names) for names in parts]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(version: str, out: Path, cache: Path, arch: int, torch: str, part_mib: int) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    download([f"vllm=={version}"], cache)
    whl = wheel_file(cache, "vllm", version)
    got, requires, built = metadata(whl)
    pin = torch_pin(requires)
    if pin != torch:
        raise Refused(f"vLLM {version} pins torch {pin}, the device has {torch}: a bundle needs a torch of its own")
    before = (built + dt.timedelta(days=NEWER_DAYS)).date()
    bundle = out / f"vllm-{version}"
    shutil.rmtree(bundle, ignore_errors=True)
    bundle.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        work = Path(tmp)
        pins = resolve(version, before, work)
        deps = carried(pins)
        download([f"{n}=={v}" for n, v in deps.items()], cache)
        wheels = [wheel_file(cache, n, v) for n, v in deps.items()]
        staging = work / "files"
        staging.mkdir()
        static = {w.name: dropped for w in wheels if (dropped := slim_wheel(w, staging))}
        slim = slim_tree(whl, work / "tree", arch)
        tar_name = f"vllm-{version}-slim-sm{arch}.tar.xz"
        archive(work / "tree", staging / tar_name)
        tar_sha = _sha(staging / tar_name)
        files = sorted(staging.iterdir())
        layout = pack(files, bundle, part_mib << 20)
    manifest: dict[str, Any] = {
        "vllm": version,
        "wheel": whl.name,
        "wheel_sha256": _sha(whl),
        "arch": f"sm_{arch}",
        "torch": torch,
        "resolved_before": before.isoformat(),
        "archive": tar_name,
        "archive_sha256": tar_sha,
        "dependencies": deps,
        "not_carried_device_has": sorted(n for n in pins if n in DEVICE_HAS),
        "not_carried_optional": {n: OPTIONAL[n] for n in sorted(pins) if n in OPTIONAL},
        "slim": {**slim, "static_libraries_left_out": static},
        "parts": {f"part{k}": names for k, names in enumerate(layout, 1)},
        "files": {},
    }
    for k, names in enumerate(layout, 1):
        folder = bundle / f"part{k}"
        for name in names:
            manifest["files"][name] = _sha(folder / name)
        (folder / "SHA256SUMS").write_text("".join(f"{manifest['files'][n]}  {n}\n" for n in names))
    for k in range(1, len(layout) + 1):
        folder = bundle / f"part{k}"
        (folder / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        shutil.copy2(INSTALLER, folder / "install.sh")
        (folder / "install.sh").chmod(0o755)
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.gpu.bundle", description=__doc__.split("\n")[0])
    ap.add_argument("version", help="vLLM release, e.g. 0.22.0")
    ap.add_argument("--out", type=Path, default=Path("build/gpu-bundle"))
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speculators-vllm-harness" / "wheels",
    )
    ap.add_argument("--arch", type=int, default=90, help="the GPU's SM version (90: H100/H200)")
    ap.add_argument("--torch", default="2.11.0", help="the device's torch release")
    ap.add_argument(
        "--part-mib",
        type=int,
        default=None,
        help="largest part, MiB (default: what a call's 64 MiB leaves beside this checkout, at most 55)",
    )
    args = ap.parse_args(argv)
    if args.part_mib is None:
        args.part_mib = default_part_mib(Path.cwd())
        print(f"harness.gpu.bundle: parts of at most {args.part_mib} MiB (a call carries 64 MiB with the checkout)")
    if not re.fullmatch(r"\d+\.\d+\.\d+", args.version):
        print(f"harness.gpu.bundle: not a release version: {args.version!r}", file=sys.stderr)
        return 2
    try:
        manifest = build(args.version, args.out.resolve(), args.cache.resolve(), args.arch, args.torch, args.part_mib)
    except Refused as why:
        print(f"harness.gpu.bundle: {why}", file=sys.stderr)
        return 2
    bundle = args.out / f"vllm-{args.version}"
    for part, names in manifest["parts"].items():
        size = sum((bundle / part / n).stat().st_size for n in names)
        print(f"{bundle / part}: {len(names)} file(s), {size / 2**20:.1f} MiB")
    print(
        f"{len(manifest['dependencies'])} dependency wheels; not carried: "
        f"{len(manifest['not_carried_device_has'])} the device has, {len(manifest['not_carried_optional'])} optional"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
