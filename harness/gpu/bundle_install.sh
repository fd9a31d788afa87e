#!/usr/bin/env bash
# Installer of every part of a bundle made by `python -m harness.gpu.bundle` (the same file in each part).
# `bash partK/install.sh` checks this part's files against SHA256SUMS and stages them in $STAGE; once every file of
# MANIFEST.json is staged (parts may come in any order, one device call each), it installs the dependency wheels
# and the slim vLLM tree into $SITE and imports vLLM from there.
# Exit: 0 installed (or already), 10 staged and waiting for other parts, 1 a checksum or install failed.
#   PY    python to use          (default /opt/torch/.venv/bin/python3)
#   SITE  target directory        (default /tmp/site; put it on PYTHONPATH afterwards)
#   STAGE staging directory       (default /tmp/bundle-stage)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PY:-/opt/torch/.venv/bin/python3}"
SITE="${SITE:-/tmp/site}"
STAGE="${STAGE:-/tmp/bundle-stage}"
(cd "$HERE" && sha256sum --quiet -c SHA256SUMS) || { echo "checksum mismatch in $HERE" >&2; exit 1; }
mkdir -p "$STAGE" "$SITE"
cp "$HERE/MANIFEST.json" "$STAGE/MANIFEST.json"
while read -r _sum name; do cp "$HERE/$name" "$STAGE/$name"; done < "$HERE/SHA256SUMS"
exec "$PY" - "$STAGE" "$SITE" <<'EOF'
import hashlib, json, pathlib, subprocess, sys, tarfile, time
stage, site = map(pathlib.Path, sys.argv[1:])
m = json.loads((stage / "MANIFEST.json").read_text())
marker = site / f".bundle-vllm-{m['vllm']}"
if marker.exists():
    print(f"vLLM {m['vllm']} bundle already installed in {site}")
    raise SystemExit(0)
missing = sorted({p for p, names in m["parts"].items() for n in names if not (stage / n).exists()})
if missing:
    print(f"staged; waiting for {', '.join(missing)} of vLLM {m['vllm']}'s bundle")
    raise SystemExit(10)
for name, sha in m["files"].items():
    if hashlib.sha256((stage / name).read_bytes()).hexdigest() != sha:
        print(f"checksum mismatch: {name}", file=sys.stderr)
        raise SystemExit(1)
t0 = time.time()
wheels = sorted(str(stage / n) for n in m["files"] if n.endswith(".whl"))
import importlib.util, shutil, zipfile
if wheels and importlib.util.find_spec("pip"):
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *wheels], check=True,
                   env={"PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PATH": "/usr/bin:/bin"})
else:  # no pip: a wheel unpacked, its purelib/platlib data moved to the top, is the same install
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
        for data in site.glob("*.data"):
            for lib in ("purelib", "platlib"):
                if (data / lib).is_dir():
                    shutil.copytree(data / lib, site, dirs_exist_ok=True)
            shutil.rmtree(data)
pieces = sorted(n for n in m["files"] if n == m["archive"] or n.startswith(m["archive"] + "."))
archive = stage / m["archive"]
if pieces != [m["archive"]]:
    with archive.open("wb") as whole:
        for n in pieces:
            whole.write((stage / n).read_bytes())
if hashlib.sha256(archive.read_bytes()).hexdigest() != m["archive_sha256"]:
    print(f"checksum mismatch: {m['archive']} once joined", file=sys.stderr)
    raise SystemExit(1)
for old in [site / "vllm", *site.glob("vllm-*.dist-info")]:
    subprocess.run(["rm", "-rf", str(old)], check=True)
with tarfile.open(archive, "r:xz") as tar:
    tar.extractall(site, filter="data")
sys.path.insert(0, str(site))
import vllm  # noqa: E402
where = pathlib.Path(vllm.__file__).resolve()
if site.resolve() not in where.parents or vllm.__version__ != m["vllm"]:
    print(f"vLLM {vllm.__version__} imported from {where}, not the bundle's {m['vllm']} in {site}", file=sys.stderr)
    raise SystemExit(1)
marker.write_text(json.dumps({"wheels": len(wheels), "seconds": round(time.time() - t0, 1)}) + "\n")
print(f"installed vLLM {m['vllm']} ({len(wheels)} dependency wheels, slim {m['arch']} tree) into {site} "
      f"in {time.time() - t0:.0f} s")
EOF
