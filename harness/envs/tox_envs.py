"""The tox envs of the version matrix, rendered from `fixtures/envs/matrix.toml`, the one place that says how
each vLLM version installs (tox.ini carries the rendered text; a unit test keeps the two in sync)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.version import Version

from harness.support.paths import FIXTURES

MATRIX_FILE = FIXTURES / "envs" / "matrix.toml"
BEGIN, END = (
    "# --- matrix envs: rendered by `python -m harness tox-envs` from fixtures/envs/matrix.toml ---",
    "# --- end of matrix envs ---",
)


def versions() -> dict[str, dict]:
    data = tomllib.loads(MATRIX_FILE.read_text())["versions"]
    return dict(sorted(data.items(), key=lambda kv: Version(kv[0])))  # PEP 440: 0.11.1 < 0.11.1.post2 < 0.12.0


def env_names() -> list[str]:
    return [v["env"] for v in versions().values()]


def tox_section() -> str:
    vs = versions()
    names = ",".join(v["env"].removeprefix("vllm") for v in vs.values())
    lines = [
        BEGIN,
        f"[testenv:vllm{{{names}}}]",
        "description = the conformance run for one vLLM CPU build (see fixtures/envs/matrix.toml)",
        "extras = suite",
        "deps =",
    ]
    for v in vs.values():  # a source-built version's package comes from `harness build-vllm`, in commands_pre
        lines += [f"    {v['env']}: {dep}" for dep in [*([] if v.get("source_build") else [v["package"]]), *v["deps"]]]
    lines += ["set_env =", "    {[testenv]set_env}"]
    for ver, v in vs.items():
        if v["overrides"]:
            lines.append(f"    {v['env']}: UV_OVERRIDE = {{toxinidir}}/fixtures/envs/vllm-{ver}.override.txt")
        if v.get("preload"):
            lines.append(f"    {v['env']}: LD_PRELOAD = {':'.join(v['preload'])}")
        lines += [f"    {v['env']}: {name} = {value}" for name, value in v.get("runtime_env", {}).items()]
    lines += ["commands_pre ="]
    lines += [
        f"    {v['env']}: python -m harness build-vllm {ver} --install {{envpython}}"
        for ver, v in vs.items()
        if v.get("source_build")
    ]
    lines += [
        "    uv pip install --quiet --python {envpython} --no-deps speculators==0.3.0",
        "    python -m harness envfix",
        "commands =",
        "    python -m harness run --env {envname} {env:HARNESS_RUN_ARGS:} -- {posargs:-q}",
        "    python -m harness bench --env {envname}",
        END,
    ]
    return "\n".join(lines) + "\n"


def render_tox_ini(text: str, matrix_file: Path | None = None) -> str:
    """`text` (tox.ini) with its matrix section and its `matrix` label rendered from fixtures/envs/matrix.toml:
    adding a version is one entry there and `python -m harness tox-envs --write`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"tox.ini lacks the markers of the rendered matrix section ({BEGIN!r} ... {END!r})")
    text = text[:start] + tox_section().rstrip("\n") + text[end + len(END) :]
    label = "    matrix = " + ", ".join([*env_names(), "matrix-report"])
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if line.strip().startswith("matrix =")]
    if len(at) != 1:
        raise ValueError("tox.ini has no single `matrix = ...` label line under [tox] labels")
    lines[at[0]] = label
    return "\n".join(lines)


def env_name_for(version: str) -> str:
    """The env name a vLLM version gets (`vllm` + its release digits, a trailing .0 dropped: 0.16.0 -> vllm016,
    0.17.1 -> vllm0171), as matrix.toml names its envs and a version outside it is run under."""
    release = list(Version(version).release)
    while len(release) > 2 and release[-1] == 0:
        release.pop()
    return "vllm" + "".join(str(p) for p in release)


def env_refusal(name: str, installed: str) -> str | None:
    """Why `harness run --env <name>` must not run on the installed vLLM (None: it may): a report is named by its
    env, so a name that is not the installed version's (or `local`) would file this vLLM's results under another
    build, or under a name nothing reads."""
    known = {v["env"]: ver for ver, v in versions().items()}
    if name == "local" or name == env_name_for(installed):
        return None
    if name in known and Version(known[name]).public == Version(installed).public:
        return None
    if name in known:
        return f"--env {name} is vLLM {known[name]}'s env, but vLLM {installed} is installed here"
    return (
        f"--env {name} is no env of fixtures/envs/matrix.toml; for the installed vLLM {installed} use "
        f"--env {env_name_for(installed)} (or local)"
    )
