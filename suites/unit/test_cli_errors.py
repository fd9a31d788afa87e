"""One CLI error contract (harness.cli.main): a refusal is one line on stderr and exit 2, with nothing written; a
missing piece names what installs it; an internal error is exit 70, never a verdict's code. Run where vLLM is not
installed (the unit env), through the real entry point."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from harness import cli
from harness.commands import matrix as matrix_command
from harness.support.paths import REPO_ROOT


def _harness(*argv: str, cwd=REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *argv], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _reports_state() -> dict:
    """reports/ as names and modification times: a refusal must neither add nor replace a report there."""
    folder = REPO_ROOT / "reports"
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.is_dir() else {}


def _inputs(folder) -> None:
    """The bad inputs some cases read: a wheel that is not a zip, an allow-list that is not TOML."""
    folder.mkdir()
    (folder / "vllm-0.99.0-cp38-abi3-linux_x86_64.whl").write_text("not a zip\n")
    (folder / "allow.toml").write_text("this is [not toml\n")


#: The bad-input table: each refused with one line on stderr, exit 2, nothing written (the case's folder and the
#: checkout's reports/ are compared before and after). {tmp}: an empty folder; {in}: the bad inputs above.
#: `--from 0.32.0` keeps the gate from saying which baseline it took (an informational line).
BAD_INPUT = [
    (["envfix"], "envfix needs a vLLM build"),
    (["bench"], "bench needs a vLLM build"),
    (["expectations", "--draft-from", "missing.json"], "No such file or directory: missing.json"),
    (["matrix", "--report-dir", "{tmp}/none"], "holds no env reports"),
    (["gate", "bisect", "--contract", "kvlayout", "--between", "0.11.0", "banana"], "'banana' is not a version number"),
    (["gate", "bisect", "--contract", "nosuch"], "unknown contract 'nosuch'"),
    (
        ["gate", "--from", "0.32.0", "--to", "0.17.0", "--json", "/proc/x.json"],
        "--json /proc/x.json: cannot write there",
    ),
    (["gate", "--from", "0.32.0", "--to", "{tmp}/missing"], "missing': no such file or folder"),
    (["gate", "--from", "0.32.0", "--to", "{in}/vllm-0.99.0-cp38-abi3-linux_x86_64.whl"], "could not be read"),
    (["gate", "--from", "0.32.0", "--to", "0.17.0", "--allowlist", "{in}/allow.toml"], "allow.toml: Expected"),
    (["gate", "--from", "0.32.0", "--to", "0.17.0", "--client", "speculators==0.0.1"], "speculators"),
]


@pytest.mark.parametrize("argv,says", BAD_INPUT, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_refusal_is_one_line_exit_2_and_writes_nothing(argv, says, tmp_path):
    pytest.importorskip("griffe")  # the unit env; vLLM itself must be absent for the first cases
    try:
        import vllm  # noqa: F401

        if argv[0] in ("envfix", "bench"):
            pytest.skip("vLLM is installed here: the command has what it needs")
    except ImportError:
        pass
    _inputs(tmp_path / "in")
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{in}", str(tmp_path / "in")) for a in argv]
    before = _reports_state()
    out = _harness(*argv)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"], "a refused command wrote something"
    assert _reports_state() == before, "a refused command wrote or replaced something in reports/"


def test_the_gate_without_its_extra_names_it():
    """griffe (the gate's extra) made unimportable in the real entry point: one line naming the extra, exit 2."""
    code = (
        "import sys; sys.modules['griffe'] = None; from harness.cli import main; "
        "sys.exit(main(['gate', '--from', '0.32.0', '--to', '0.17.0']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs the harness's [gate] extra (in a checkout: pip install '.[gate]')" in lines[0], (
        out.stderr
    )


def test_an_internal_error_is_70_never_a_verdict(monkeypatch, capsys):
    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(matrix_command, "cmd_matrix_envs", broken)
    assert cli.main(["matrix-envs"]) == cli.INTERNAL == 70
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error (KeyError" in err[0]


def test_version_and_exit_codes_in_help():
    out = _harness("--version")
    assert out.returncode == 0 and re.fullmatch(r"harness \d+\.\d+\.\d+\S*\n", out.stdout), out.stdout
    assert "70  internal error" in _harness("--help").stdout
