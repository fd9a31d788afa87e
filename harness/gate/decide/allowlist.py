"""Findings accepted for a limited time: `fixtures/gate/allowlist.toml`.

Modelled on PyTorch's forward/backward-compatibility allow list: every entry has a reason and an
expiry date, so an accepted risk is revisited instead of forgotten. An entry accepts a finding
whose contract id equals its pattern or whose symbol matches it as a glob. After its date it
stops counting, and the gate says it expired (and which findings it would have accepted).
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.support.paths import FIXTURES
from harness.vllm_source.facts import Finding

DEFAULT = FIXTURES / "gate" / "allowlist.toml"


class AllowlistError(ValueError):
    """The allow-list cannot be read; the gate cannot decide (exit 2)."""


@dataclass(frozen=True)
class Entry:
    pattern: str
    reason: str
    expires: _dt.date

    def matches(self, finding: Finding) -> bool:
        return self.pattern == finding.contract or fnmatch.fnmatchcase(finding.symbol, self.pattern)

    def active(self, today: _dt.date) -> bool:
        return today <= self.expires

    def to_json(self) -> dict:
        return {"pattern": self.pattern, "reason": self.reason, "expires": self.expires.isoformat()}


def load(path: Path | None = None) -> list[Entry]:
    path = Path(path or DEFAULT)
    if not path.is_file():
        raise AllowlistError(f"allow-list {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise AllowlistError(f"{path}: {exc}") from None
    entries = []
    for i, raw in enumerate(data.get("accept", []), 1):
        missing = [k for k in ("pattern", "reason", "expires") if not raw.get(k)]
        if missing:
            raise AllowlistError(f"{path}: entry {i} lacks {', '.join(missing)} (every entry needs all three)")
        expires = raw["expires"]
        if isinstance(expires, str):
            try:
                expires = _dt.date.fromisoformat(expires)
            except ValueError:
                raise AllowlistError(f"{path}: entry {i}: expires {expires!r} is not YYYY-MM-DD") from None
        if isinstance(expires, _dt.datetime) or not isinstance(expires, _dt.date):
            raise AllowlistError(f"{path}: entry {i}: expires must be a date (YYYY-MM-DD)")
        entries.append(Entry(str(raw["pattern"]), str(raw["reason"]), expires))
    return entries


def apply(findings: list[Finding], entries: list[Entry], today: _dt.date) -> list[dict]:
    """Mark open findings (uncovered, or undecided for want of --model-config) an active entry accepts; return
    the expired entries (with what they match)."""
    for f in findings:
        if f.status not in ("uncovered", "needs-model-config"):
            continue
        entry = next((e for e in entries if e.active(today) and e.matches(f)), None)
        if entry is not None:
            f.status, f.reason = "accepted", f"allow-list {entry.pattern!r} until {entry.expires}: {entry.reason}"
    return [
        {**e.to_json(), "would_accept": [f.symbol for f in findings if e.matches(f)]}
        for e in entries
        if not e.active(today)
    ]
