"""C-import: `import speculators.data_generation` works with the installed transformers.

speculators' config classes are pydantic models that also subclass transformers' PretrainedConfig;
importing speculators rebuilds their schemas, which evaluates every inherited annotation. In
transformers 5, `PretrainedConfig.dtype` is annotated `Union[str, "torch.dtype"]` while
`transformers.configuration_utils` imports torch only for type checkers, so pydantic fails with
"name 'torch' is not defined" and speculators cannot be imported at all (vLLM 0.20+ environments
resolve transformers 5). Shim: give that module its `torch` global before speculators is imported
(in the driver and in every worker).

Probed in fresh interpreters (an import cannot be undone in this one).
"""

from __future__ import annotations

import subprocess
import sys

from harness.contracts.base import Attempt, Contract, Observation

CONTRACT = Contract(
    id="import",
    assumes="import speculators.data_generation works with the installed transformers",
    failures=(r"name 'torch' is not defined",),
    shim="harness.contracts.speculators_import.apply_import",
)

TARGET = "speculators.data_generation"


def needed() -> bool:
    import transformers.configuration_utils as cu

    hints = getattr(cu.PretrainedConfig, "__annotations__", {})
    # Strings or ForwardRef('torch.dtype') inside a Union: either way, a name pydantic must resolve.
    mentions_torch = any("torch." in (v if isinstance(v, str) else repr(v)) for v in hints.values())
    return mentions_torch and not hasattr(cu, "torch")


def apply_import() -> bool:
    """Call before importing speculators. Returns whether the shim was needed."""
    if not needed():
        return False
    import torch
    import transformers.configuration_utils as cu

    cu.torch = torch
    return True


def _fresh_import(with_shim: bool) -> Attempt:
    prelude = "from harness.contracts.speculators_import import apply_import; apply_import(); " if with_shim else ""
    proc = subprocess.run([sys.executable, "-c", f"{prelude}import {TARGET}"], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode == 0:
        return Attempt(True)
    kind, message = _last_exception(proc.stderr)
    return Attempt.failed(kind, message, raised_at="import " + TARGET)


def prove(with_shim: bool) -> Attempt:
    """The shim proof's run: speculators' own import in a fresh interpreter, with or without the shim."""
    return _fresh_import(with_shim)


def _last_exception(stderr: str) -> tuple[str, str]:
    """The exception a traceback ended with (pydantic adds a 'For further information' line after it)."""
    import re

    for line in reversed(stderr.strip().splitlines()):
        m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Annotation|Exit)): (.*)$", line)
        if m:
            return m.group(1).split(".")[-1], m.group(2)
    return "ImportError", (stderr.strip().splitlines() or ["(no output)"])[-1]


def _selected_in_fresh_interpreter() -> bool:
    """What `needed()` decides in a fresh interpreter. In this one the shim may already be in place (any
    generator started earlier in the session applied it), and then `needed()` rightly says no."""
    proc = subprocess.run([sys.executable, "-c", "from harness.contracts.speculators_import import needed; "
                           "print(needed())"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"needed() failed in a fresh interpreter: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip().splitlines()[-1] == "True"


def probe(ctx=None) -> Observation:
    unshimmed = _fresh_import(False)
    shimmed = None if unshimmed.ok else _fresh_import(True)
    import transformers

    return Observation(CONTRACT, unshimmed, shimmed,
                       {"transformers": transformers.__version__, "shim_selected": _selected_in_fresh_interpreter()})
