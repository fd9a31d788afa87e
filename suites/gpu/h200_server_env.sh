# shellcheck shell=bash
# Sourced after h200_env.sh by the scripts that start `vllm serve` on the H200: the vLLM 0.20.0 bundle carries
# what the in-process path imports, not the HTTP front end. The wheels in .srv-wheels (pip download --no-deps,
# cp312 manylinux; the versions vLLM 0.20's CPU build resolves to) are installed into $SITE, each only where its
# import is missing, so nothing the bundle or the torch venv provides is shadowed.
if [ ! -e "$SITE/.harness-server-done" ]; then
  "$PY" - <<'PYEOF' || exit 7
import importlib.util, pathlib, subprocess, sys, zipfile
site = "/tmp/site"
todo = []
for whl in sorted(pathlib.Path(".srv-wheels").glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        tops = sorted({n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith((".dist-info", ".data"))})
    mods = [t[:-3] if t.endswith(".py") else t for t in tops if not t.endswith(".pth")]
    if any(importlib.util.find_spec(m) is None for m in mods if m.isidentifier()):
        todo.append(str(whl))
print("server wheels to install:", " ".join(pathlib.Path(t).name for t in todo) or "none")
if todo:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--target", site, "--upgrade", *todo], check=True)
PYEOF
  touch "$SITE/.harness-server-done"
fi
