"""One CLI error contract (harness.cli.main): a refusal is one line on stderr and exit 2, with nothing written; a
missing piece names what installs it; an internal error is exit 70, never a verdict's code. Run where vLLM is not
installed (the unit env), through the real entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import cli
from harness.paths import REPO_ROOT


def _harness(*argv: str, cwd=REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("argv,says", [
    (["envfix"], "envfix needs a vLLM build"),
    (["expectations", "--draft-from", "missing.json"], "No such file or directory: missing.json"),
    (["matrix", "--report-dir", "{tmp}/none"], "holds no env reports"),
])
def test_a_refusal_is_one_line_exit_2_and_writes_nothing(argv, says, tmp_path):
    pytest.importorskip("griffe")  # the unit env; vLLM itself must be absent for the first case
    try:
        import vllm  # noqa: F401
        if argv == ["envfix"]:
            pytest.skip("vLLM is installed here: envfix has what it needs")
    except ImportError:
        pass
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = _harness(*argv)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == [], "a refused command wrote something"


def test_an_internal_error_is_70_never_a_verdict(monkeypatch, capsys):
    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "cmd_matrix_envs", broken)
    assert cli.main(["matrix-envs"]) == cli.INTERNAL == 70
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error (KeyError" in err[0]


def test_version_and_exit_codes_in_help():
    out = _harness("--version")
    assert out.returncode == 0 and out.stdout.startswith("python -m harness ")
    assert "70  internal error" in _harness("--help").stdout
