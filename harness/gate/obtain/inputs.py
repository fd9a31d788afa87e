"""What the gate is asked, checked before anything is obtained: the two sides from the flags and the team's lock
files (--lockfile, --base-lockfile), the client release, --model-config, the allow-list and where reports go. Bad
input is `InputRefused`: one line, exit 2, nothing downloaded, no report written."""

from __future__ import annotations

import json
from pathlib import Path


class InputRefused(ValueError):
    """Bad input to the gate: one line, exit 2, nothing downloaded, no report written."""


def read_lockfiles(args) -> None:
    """--lockfile (the team's pins: --from, and the speculators release whose path is judged) and, in a pull
    request, --base-lockfile (the base branch's pins: then --from is the base's vLLM and --to the head's)."""
    from packaging.version import Version

    from harness.gate.obtain.pin import NoPin, pins

    def read(flag: str, path: str) -> dict:
        try:
            return pins(path)
        except NoPin as exc:
            raise InputRefused(f"{flag}: {exc}") from None

    head = read("--lockfile", args.lockfile) if getattr(args, "lockfile", None) else None
    base = read("--base-lockfile", args.base_lockfile) if getattr(args, "base_lockfile", None) else None
    if base is not None:
        if head is None:
            raise InputRefused("--base-lockfile needs --lockfile (the pull request's head)")
        if args.to_version and args.to_version != head["vllm"]:
            raise InputRefused(f"--to {args.to_version} and --lockfile's vllm {head['vllm']} disagree: give one")
        args.to_version = head["vllm"]
        pinned, where = base, f"the base's {Path(args.base_lockfile).name}"
    elif head is not None:
        pinned, where = head, Path(args.lockfile).name
    else:
        return
    if args.from_version and args.from_version != pinned["vllm"]:
        raise InputRefused(f"--from {args.from_version} and the lock file's vllm {pinned['vllm']} disagree: give one")
    args.from_version = pinned["vllm"]
    args.from_reason = f"pinned in {where}"
    spec = (head or pinned)["speculators"]
    if spec and not args.client and Version(spec) >= Version("0.5"):
        args.client = f"speculators=={spec}"
    elif spec and not args.client:
        args.speculators = spec


def checked_input(args) -> tuple:
    """Both sides parsed (--to first; versions normalised, files and folders exist), --model-config read, report
    paths writable, settings valid."""
    import hashlib
    import os

    from harness.envs import sources
    from harness.gate.obtain import artifacts

    if getattr(args, "client", None):
        from harness.gate.read.client import ClientUnknown, parse_client

        try:
            args.client_version = parse_client(args.client)
        except ClientUnknown as exc:
            raise InputRefused(str(exc)) from None
    if args.from_version is None:
        from harness.gate.obtain.baseline import last_known_good

        args.from_version, args.from_reason = last_known_good()
    try:
        new = artifacts.parse(args.to_version)
        old = artifacts.parse(args.from_version)
        sources.timeout_s()
    except (sources.VersionNotFound, sources.BadSetting) as exc:
        raise InputRefused(str(exc)) from None
    if getattr(args, "allowlist", None):  # the team's allow-list: read now, so a bad one is refused, not undecided
        from harness.gate.decide import allowlist

        try:
            allowlist.load(Path(args.allowlist))
        except allowlist.AllowlistError as exc:
            raise InputRefused(str(exc)) from None
    checkpoint = None
    if args.model_config:
        path = Path(args.model_config)
        try:
            raw = path.read_bytes()
            data = json.loads(raw)
        except (OSError, ValueError) as exc:
            raise InputRefused(f"--model-config {args.model_config}: not a readable JSON file ({exc})") from None
        if not isinstance(data, dict):
            raise InputRefused(f"--model-config {args.model_config}: not a JSON object")
        checkpoint = {"config": data.get("text_config", data), "sha256": hashlib.sha256(raw).hexdigest()}
    for flag, value in (("--json", args.json), ("--summary", args.summary)):
        if value is None:
            continue
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
    return old, new, checkpoint


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder` (tried, then removed): permission bits do not tell for root, nor
    for pseudo file systems such as /proc, and the refusal must come before the gate runs, not after."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".harness-gate-", suffix=".probe"):
            return True
    except OSError:
        return False
