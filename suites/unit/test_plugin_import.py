"""The suites' pytest plugin changes nothing by being imported: its environment defaults are set when pytest
configures a session that loads it (before any test module imports vLLM), so importing the harness from a user's
own code or tests leaves their environment alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.testing.plugin import ENV_DEFAULTS

SHOW = "import json, os, sys; {imports}; print(json.dumps({{k: os.environ.get(k) for k in {keys!r}}}))"


def _env_after(imports: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DEFAULTS}
    out = subprocess.run(
        [sys.executable, "-c", SHOW.format(imports=imports, keys=sorted(ENV_DEFAULTS))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def test_importing_the_plugin_sets_nothing():
    assert _env_after("import harness.testing.plugin") == {k: None for k in ENV_DEFAULTS}


def test_a_session_with_the_plugin_gets_the_defaults(tmp_path):
    (tmp_path / "test_env.py").write_text(
        "import json, os\n"
        f"def test_env():\n    print('ENV=' + json.dumps({{k: os.environ.get(k) for k in {sorted(ENV_DEFAULTS)!r}}}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ENV_DEFAULTS}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "harness.testing.plugin",
            "-p",
            "no:cacheprovider",
            "-s",
            "-q",
            "--harness-no-report",
            str(tmp_path / "test_env.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("ENV=")), None)
    assert line is not None, out.stdout[-2000:] + out.stderr[-2000:]
    assert json.loads(line[4:]) == ENV_DEFAULTS
