"""The gate's reference side when `--from` is not given: the last known good vLLM.

Projects that track an upstream main keep a "verified commit" file; here that is `fixtures/gate/verified.toml`
(`[vllm] version = ..., commit = ..., verified = <date>`), which wins when present. Otherwise the newest version
of the matrix whose committed env report passes (judged again from its content), else the version speculators
0.3.0 was written for."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from harness.support.paths import FIXTURES, REPORTS

VERIFIED = FIXTURES / "gate" / "verified.toml"
WRITTEN_FOR = "0.11.0"


def last_known_good(report_dir: Path = REPORTS, verified: Path = VERIFIED) -> tuple[str, str]:
    """(version, why this one)."""
    if verified.is_file():
        pin = tomllib.loads(verified.read_text()).get("vllm", {})
        if pin.get("version"):
            extra = ", ".join(f"{k} {pin[k]}" for k in ("commit", "verified") if pin.get(k))
            return str(pin["version"]), f"pinned in {verified.name}" + (f" ({extra})" if extra else "")
    from harness.envs import tox_envs
    from harness.reporting.report import judge

    passing = []
    for version, meta in tox_envs.versions().items():
        path = Path(report_dir) / f"{meta['env']}.json"
        if path.is_file() and judge(json.loads(path.read_text()))[0] == "pass":
            passing.append((version, path.name))
    if passing:
        version, name = passing[-1]
        return version, f"the newest version whose committed env report passes (reports/{name})"
    return WRITTEN_FOR, "the version speculators 0.3.0 was written for (no committed env report passes)"
