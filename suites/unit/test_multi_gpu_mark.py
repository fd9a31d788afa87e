"""`multi_gpu(n)` is a mark that acts: with fewer GPUs than it asks for, the test is skipped with the reason."""

import subprocess
import sys
import textwrap

from harness.testing.gpu import gpus_on_this_host


def test_a_test_needing_more_gpus_than_here_is_skipped_with_the_count(tmp_path):
    need = gpus_on_this_host() + 1
    (tmp_path / "test_needs_gpus.py").write_text(
        textwrap.dedent(f"""
        import pytest

        @pytest.mark.multi_gpu({need})
        def test_needs():
            raise AssertionError("must not run")

        @pytest.mark.multi_gpu(0)
        def test_runs():
            pass
    """)
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "harness.testing.plugin",
            "-p",
            "no:cacheprovider",
            "-rs",
            "--harness-no-report",
            "-o",
            "markers=multi_gpu(n): n GPUs",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert "1 passed, 1 skipped" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"needs {need} GPUs of one host, this host has {need - 1}" in out.stdout
