"""A wheel restamped with another version: the same files under another version's name, its metadata and record
made consistent (installers check that the file name, the dist-info folder and METADATA agree, and RECORD's hashes).

What it is for: trying a tool that takes "any build" on a build nobody published, such as a release's wheel under a
nightly's version (`0.17.1.dev3+g0123abc`), without a compiler. The code inside is unchanged.

    python -m harness.support.wheel_version WHEEL VERSION DEST_FOLDER
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def restamp(wheel: Path, version: str, dest: Path) -> Path:
    """`wheel` as version `version`, written into `dest` (returned); `wheel` itself is left as it is."""
    name, old, rest = Path(wheel).name.split("-", 2)
    old_info, new_info = f"{name}-{old}.dist-info/", f"{name}-{version.replace('-', '_')}.dist-info/"
    out = Path(dest) / f"{name}-{version.replace('-', '_')}-{rest}"
    with zipfile.ZipFile(wheel) as src:
        files = {i.filename: src.read(i) for i in src.infolist() if not i.is_dir()}
    renamed: dict[str, bytes] = {}
    for path, data in files.items():
        path = new_info + path[len(old_info) :] if path.startswith(old_info) else path
        if path == new_info + "METADATA":
            data = re.sub(rb"^Version: .*$", f"Version: {version}".encode(), data, count=1, flags=re.M)
        renamed[path] = data
    record = new_info + "RECORD"
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")  # CSV, as the wheel format says: a path may hold a comma
    writer.writerows([p, _record_hash(d), len(d)] for p, d in renamed.items() if p != record)
    writer.writerow([record, "", ""])
    renamed[record] = rows.getvalue().encode()
    Path(dest).mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in renamed.items():
            z.writestr(path, data)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or not Path(args[0]).is_file() or not args[0].endswith(".whl"):
        print("usage: python -m harness.support.wheel_version WHEEL VERSION DEST_FOLDER", file=sys.stderr)
        return 2
    print(restamp(Path(args[0]), args[1], Path(args[2])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
