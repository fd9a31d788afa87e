"""Reports that a re-run reproduces byte for byte, apart from the fields that measure time.

Committed reports are compared by people (git diff) and by tests (pages rebuilt from them). Evidence often quotes
an error or a log line of a vLLM worker, and such a line carries what differs every run: the worker's pid, the
log line's clock time, a temporary folder's random name, a port the OS picked, a memory address, the random
suffix vLLM appends to a request id. `text()` replaces exactly those tokens with a placeholder and keeps the
message, the file:line and the exception type, so the same failure reads the same in every run.

What is left to differ is of two kinds, both named here and nowhere else:
- what each run measures anew, in `TIMING_KEYS`: time (a report's `generated_at`, per-attempt `seconds`, wall
  times, the `timings` block; the `.bench.json` file is nothing but timings) and the soak's host memory peaks
  (also printed as "N MiB" in its row's `measured` text; they move by tens of MiB between two runs on one
  machine). `without_timings()` drops exactly those, and on one machine two runs with the same verdicts agree on
  everything else (seen: three CI runs of vllm016 on one Xeon; two runs on one EPYC);
- what the CPU's kernels decide: every float measured from tensors (differences against transformers, bounds
  derived from magnitudes, ratios: their last digits), and the CPU's name (`platform.cpu`). A run on another CPU
  (an EPYC instead of the Xeon a report was made on) differs there and only there when its verdicts are the same.
  `comparable()` drops those by kind of value, not by a list of keys (`machine_independent`): every float, and
  every float literal inside text, is masked; strings, bools and integers (verdicts, counts) are kept. So two
  reports of one vLLM with the same verdicts are `comparable`-equal on any x86 machine, and a contract added
  tomorrow with float facts needs no entry here.
`markdown_without_timings()` and `comparable_markdown()` do the same for `reports/<env>.md`.
"""

from __future__ import annotations

import re

from harness.support.volatile import map_strings, stable, text  # noqa: F401 - also this module's API

#: Keys whose values measure time: every other field of a report is reproduced by a re-run with the same verdicts.
TIMING_KEYS = frozenset(
    {"generated_at", "seconds", "wall_s", "proofs_s", "timings", "host_peak_warmup", "host_peak_after"}
)
#: How a memory peak prints in an e2e row's `measured` text and the Markdown.
_MIB = re.compile(r"\b\d+ MiB\b")


def _drop_keys(value, keys: frozenset):
    """`value` (nested dicts and lists) without the dict entries named in `keys`, at any depth."""
    if isinstance(value, dict):
        return {k: _drop_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_drop_keys(v, keys) for v in value]
    return value


def without_timings(value):
    """A report (or any part of one) without its `TIMING_KEYS` at any depth, and the memory peaks its e2e rows
    print masked: what two runs on one machine must agree on."""
    if isinstance(value, dict):
        out = {k: without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
        if isinstance(out.get("measured"), str) and "check" in out:  # an e2e row
            out["measured"] = _MIB.sub("<n> MiB", out["measured"])
        return out
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


#: A float literal inside text ("3.19e-06", "2.3173744678497314", "-0.5"), never part of a dotted version or
#: address ("0.16.0", "127.0.0.1"): what the machine-independent comparison masks in strings.
_FLOAT_TEXT = re.compile(r"(?<![\d.])[-+]?\d+\.\d+(?:[eE][-+]?\d+)?(?![\d.])|(?<![\d.])\d+[eE][-+]\d+(?![\d.])")
#: What a float becomes in the machine-independent comparison: its kind is kept, its digits are not.
FLOAT = "<float>"


def machine_independent(value):
    """`value` (nested dicts, lists, scalars) with every float replaced by `FLOAT` and every float literal in its
    strings by "<n>". The rule is by kind of value, not by key: a report's floats are measured from tensors
    (differences, bounds, magnitudes, ratios) or from the clock, and another x86 CPU's kernels decide their last
    digits, while every verdict is a string, a bool or an integer count, which are kept. So a new contract's
    float facts need no registration here, and a verdict that changes is never masked."""
    if isinstance(value, dict):
        return {k: machine_independent(v) for k, v in value.items()}
    if isinstance(value, list):
        return [machine_independent(v) for v in value]
    if isinstance(value, float):
        return FLOAT
    if isinstance(value, str):
        return _FLOAT_TEXT.sub("<n>", value)
    return value


def comparable(rep: dict) -> dict:
    """An env report without timings and without what the machine's CPU decides (see the module's docstring):
    `machine_independent` of it, the CPU's name dropped."""
    out = machine_independent(without_timings(rep))
    if isinstance(out.get("platform"), dict):
        out["platform"] = {k: v for k, v in out["platform"].items() if k != "cpu"}
    return out


#: The lines of an env report's Markdown that render timing fields (see `harness.reporting.report_markdown.markdown`).
_MD_GENERATED = re.compile(r" Generated [0-9T:+-]+\.$")
_MD_TIME_SECTIONS = ("## Wall time per tier", "## Where the time went")
_MD_E2E = "## End to end"


def markdown_without_timings(md: str) -> str:
    """An env report's Markdown without what renders timing fields: the "Generated ..." stamp and the two
    time sections (each runs to the next heading)."""
    out, skipping, in_e2e = [], False, False
    for line in md.splitlines():
        if line.startswith("## "):
            skipping = line in _MD_TIME_SECTIONS
            in_e2e = line.startswith(_MD_E2E)
        if not skipping:
            line = _MD_GENERATED.sub("", line)
            out.append(_MIB.sub("<n> MiB", line) if in_e2e and line.startswith("| ") else line)
    return "\n".join(out) + "\n"


_MD_CPU = re.compile(r"(, \d+ CPUs); .*\)\.$")


def comparable_markdown(md: str) -> str:
    """`markdown_without_timings`, with the CPU's name dropped and every float literal masked (the rule of
    `machine_independent`: what the CPU decides, wherever the page prints it)."""
    lines = (_FLOAT_TEXT.sub("<n>", _MD_CPU.sub(r"\1).", line)) for line in markdown_without_timings(md).splitlines())
    return "\n".join(lines) + "\n"


# -- a checkout's reports against a commit --------------------------------------------------------------
def _same(name: str, old: str, new: str) -> bool:
    """Whether a committed report file and its rewrite agree on everything but timing fields."""
    import json

    if name.endswith(".bench.json"):  # a bench file is timings only
        return True
    if name.endswith(".json"):
        try:
            return comparable(json.loads(old)) == comparable(json.loads(new))
        except ValueError:
            return False
    if name.endswith(".md"):
        return comparable_markdown(old) == comparable_markdown(new)
    return old == new


def changed_beyond_timings(root, rev: str = "HEAD", folder: str = "reports") -> list[str]:
    """The files under `folder` of the checkout at `root` that differ from `rev` in more than timing fields
    (a file added or removed counts). Raises RuntimeError when `root` is not a git checkout or `rev` is unknown."""
    import subprocess
    from pathlib import Path

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"git {' '.join(args)}: {out.stderr.strip() or 'failed'}")
        return out.stdout

    names = git("diff", "--name-only", "--no-renames", rev, "--", folder).split()
    names += git("ls-files", "--others", "--exclude-standard", "--", folder).split()
    changed = []
    for name in sorted(set(names)):
        path = Path(root) / name
        if not path.exists():
            changed.append(f"{name}: removed")
            continue
        try:
            old = git("show", f"{rev}:{name}")
        except RuntimeError:
            changed.append(f"{name}: added")
            continue
        try:
            new = path.read_text()
        except UnicodeDecodeError:
            changed.append(f"{name}: changed (binary)")
            continue
        if not _same(name, old, new):
            changed.append(f"{name}: changed beyond its timing fields")
    return changed


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.reporting.stable [--rev REV]`: exit 0 when reports/ differs from REV (default HEAD) in
    timing fields only, 1 listing the files that differ in more, 2 when it cannot tell (not a git checkout)."""
    import argparse
    import sys

    from harness.support.paths import REPO_ROOT

    ap = argparse.ArgumentParser(prog="python -m harness.reporting.stable", description=main.__doc__)
    ap.add_argument("--rev", default="HEAD", help="the commit to compare reports/ with (default HEAD)")
    ap.add_argument("--root", default=str(REPO_ROOT), help="the checkout (default: this one)")
    args = ap.parse_args(argv)
    try:
        changed = changed_beyond_timings(args.root, args.rev)
    except (RuntimeError, OSError) as exc:
        print(f"harness: cannot compare reports/ with {args.rev}: {exc}", file=sys.stderr)
        return 2
    for line in changed:
        print(line)
    print(
        f"harness: reports/ against {args.rev}: "
        + (f"{len(changed)} files differ beyond their timing fields" if changed else "only timing fields differ")
    )
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
