"""What the gate is asked, checked before anything is obtained: the two sides from the flags and the team's lock
files (--lockfile, --base-lockfile), the client release, --model-config, the allow-list and where reports go. Bad
input is `InputRefused`: one line, exit 2, nothing downloaded, no report written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.gate.obtain.artifacts import Spec


class InputRefused(ValueError):
    """Bad input to the gate: one line, exit 2, nothing downloaded, no report written."""


#: The in-process release judged when neither a lock file nor --speculators names one.
DEFAULT_SPECULATORS = "0.3.0"


@dataclass(frozen=True)
class Request:
    """What the gate was asked, checked once before anything is obtained: the two sides, the path judged (the
    in-process generator of `speculators`, or a client release over `vllm serve`), and the options. Every later step
    (obtain, read, observe, decide, report) takes this, never the command line's namespace."""

    old: Spec
    new: Spec
    from_reason: str | None = None  # why --from is what it is, where the user did not give it
    speculators: str = DEFAULT_SPECULATORS
    client_version: str | None = None
    surface: Path | None = None
    regenerate_surface: bool = False
    allowlist: Path | None = None
    checkpoint: dict | None = None  # --model-config: {"config", "sha256", "file"}
    cache_dir: str | None = None
    observe: str | None = None  # "dynamic" (run the candidate) | "reports" (read its build's report) | None
    json: Path | None = None
    summary: Path | None = None


@dataclass(frozen=True)
class _Pins:
    """What the flags and lock files say of the sides and the path."""

    to: str | None
    frm: str | None
    from_reason: str | None
    client: str | None
    speculators: str


def read_lockfiles(args) -> _Pins:
    """--lockfile (the team's pins: --from, and the speculators release whose path is judged) and, in a pull
    request, --base-lockfile (the base branch's pins: then --from is the base's vLLM and --to the head's)."""
    from packaging.version import Version

    from harness.gate.obtain.pin import NoPin, pins

    def read(flag: str, path: str) -> dict:
        try:
            return pins(path)
        except NoPin as exc:
            raise InputRefused(f"{flag}: {exc}") from None

    given = _Pins(args.to_version, args.from_version, None, args.client, args.speculators or DEFAULT_SPECULATORS)
    head = read("--lockfile", args.lockfile) if getattr(args, "lockfile", None) else None
    base = read("--base-lockfile", args.base_lockfile) if getattr(args, "base_lockfile", None) else None
    to = given.to
    if base is not None:
        if head is None:
            raise InputRefused("--base-lockfile needs --lockfile (the pull request's head)")
        if to and to != head["vllm"]:
            raise InputRefused(f"--to {to} and --lockfile's vllm {head['vllm']} disagree: give one")
        to = head["vllm"]
        pinned, where = base, f"the base's {Path(args.base_lockfile).name}"
    elif head is not None:
        pinned, where = head, Path(args.lockfile).name
    else:
        return given
    if given.frm and given.frm != pinned["vllm"]:
        raise InputRefused(f"--from {given.frm} and the lock file's vllm {pinned['vllm']} disagree: give one")
    client, speculators = given.client, given.speculators
    spec = (head or pinned)["speculators"]
    if not spec and not client and not args.speculators:
        lock = Path(args.lockfile).name
        raise InputRefused(
            f"{lock} pins no speculators, so it does not say which extraction path to judge: add the release your "
            "training runs (`uv add speculators==X.Y.Z`), or pass --client speculators==X.Y.Z or --speculators X.Y.Z"
        )
    if spec and not client and Version(spec) >= Version("0.5"):
        client = f"speculators=={spec}"
    elif spec and not client:
        speculators = spec
    return _Pins(to, pinned["vllm"], f"pinned in {where}", client, speculators)


def request(args) -> Request:
    """The gate's request from the command line: lock files read, both sides parsed (--to first; versions
    normalised, files and folders exist), --model-config read, report paths writable, settings valid. Bad input is
    InputRefused (one line, exit 2)."""
    pins = read_lockfiles(args)
    if not pins.to:
        raise InputRefused("--to is required (or --base-lockfile with --lockfile; or: gate bisect --contract ID)")
    client_version = _client_version(pins.client)
    old, new, from_reason = _sides(pins)
    if getattr(args, "allowlist", None):  # the team's allow-list: read now, so a bad one is refused, not undecided
        from harness.gate.decide import allowlist

        try:
            allowlist.load(Path(args.allowlist))
        except allowlist.AllowlistError as exc:
            raise InputRefused(str(exc)) from None
    checkpoint = _checkpoint(args.model_config) if args.model_config else None
    for flag, value in (("--json", args.json), ("--summary", args.summary)):
        if value is not None:
            _writable(flag, value)
    return Request(
        old,
        new,
        from_reason=from_reason,
        speculators=pins.speculators,
        client_version=client_version,
        surface=Path(args.surface) if args.surface else None,
        regenerate_surface=bool(args.regenerate_surface),
        allowlist=Path(args.allowlist) if args.allowlist else None,
        checkpoint=checkpoint,
        cache_dir=args.cache_dir,
        observe="dynamic" if args.dynamic else "reports" if args.use_reports else None,
        json=Path(args.json) if args.json else None,
        summary=Path(args.summary) if args.summary else None,
    )


def _client_version(client: str | None) -> str | None:
    """The speculators release of `--client speculators==X.Y.Z` (None: the in-process path is judged)."""
    if not client:
        return None
    from harness.gate.read.client import ClientUnknown, parse_client

    try:
        return parse_client(client)
    except ClientUnknown as exc:
        raise InputRefused(str(exc)) from None


def _sides(pins: _Pins) -> tuple:
    """(old, new, why old is what it is): --from given or pinned, else the last known good build."""
    from harness.envs import sources
    from harness.gate.obtain import artifacts

    frm, from_reason = pins.frm, pins.from_reason
    if frm is None:
        from harness.gate.obtain.baseline import last_known_good

        frm, from_reason = last_known_good()
    try:
        new = artifacts.parse(str(pins.to))
        old = artifacts.parse(frm)
        sources.timeout_s()
    except (sources.VersionNotFound, sources.BadSetting) as exc:
        raise InputRefused(str(exc)) from None
    return old, new, from_reason


def _checkpoint(model_config: str) -> dict:
    """--model-config read: the text config a config-gated finding is decided by, its digest and file name."""
    import hashlib

    path = Path(model_config)
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise InputRefused(f"--model-config {model_config}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise InputRefused(f"--model-config {model_config}: not a JSON object")
    return {"config": data.get("text_config", data), "sha256": hashlib.sha256(raw).hexdigest(), "file": path.name}


def _writable(flag: str, value: str) -> None:
    """A report path the gate will write: refused now where it cannot, not after the gate has run."""
    import os

    target = Path(value)
    parent = target.parent if str(target.parent) else Path(".")
    if (
        target.is_dir()
        or not parent.is_dir()
        or not os.access(parent, os.W_OK)
        or (target.exists() and not os.access(target, os.W_OK))
        or not _can_create_in(parent)
    ):
        raise InputRefused(f"{flag} {value}: cannot write there (no such folder, not writable, or a folder)")


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder` (tried, then removed): permission bits do not tell for root, nor
    for pseudo file systems such as /proc, and the refusal must come before the gate runs, not after."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".harness-gate-", suffix=".probe"):
            return True
    except OSError:
        return False
