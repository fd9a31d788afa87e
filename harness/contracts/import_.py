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

import functools
import json
import subprocess
import sys

from harness.contracts.base import Attach, Attempt, Contract, Observation, Shim

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


#: Run in a fresh interpreter: whether the shim is needed there (before anything imports torch into
#: transformers' module), then speculators' import, with or without this shim (the other contracts' IMPORT shims,
#: such as C-kvhelpers' aliases of helpers vLLM moved, always on, as in a real run); one JSON line on stdout.
_CHILD = """
import json
from harness import contracts
from harness.contracts.base import Attach
from harness.contracts.import_ import apply_import, needed
out = {"needed": needed()}
for _, other in contracts.selected(Attach.IMPORT, {"import"}):  # other contracts' import-time shims (moved helpers)
    other.fn()
if WITH_SHIM:
    apply_import()
try:
    import speculators.data_generation
    out["ok"] = True
except BaseException as e:
    out.update(ok=False, kind=type(e).__name__, message=(str(e).strip().splitlines() or [repr(e)])[0])
print("HARNESS-IMPORT " + json.dumps(out))
"""


@functools.cache
def _fresh_import(with_shim: bool) -> tuple[Attempt, bool]:
    """speculators' import in a fresh interpreter, and whether `needed()` said yes there. Cached for the
    session: the probe and the shim proof ask the same question of the same installation, and each answer
    costs an interpreter that imports torch, transformers and vLLM."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.replace("WITH_SHIM", str(with_shim))], capture_output=True, text=True, timeout=600
    )
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("HARNESS-IMPORT ")), None)
    if line is None:  # the interpreter died before it could say (a crash in an extension, say)
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Attempt.failed("ChildDied", f"exit code {proc.returncode}: {tail}", raised_at="import " + TARGET), False
    out = json.loads(line[len("HARNESS-IMPORT ") :])
    attempt = Attempt(True) if out["ok"] else Attempt.failed(out["kind"], out["message"], raised_at="import " + TARGET)
    return attempt, bool(out["needed"])


def prove(with_shim: bool) -> Attempt:
    """The shim proof's run: speculators' own import in a fresh interpreter, with or without the shim."""
    return _fresh_import(with_shim)[0]


def probe(ctx=None) -> Observation:
    unshimmed, selected = _fresh_import(False)
    shimmed = None if unshimmed.ok else _fresh_import(True)[0]
    import transformers

    return Observation(
        CONTRACT, unshimmed, shimmed, {"transformers": transformers.__version__, "shim_selected": selected}
    )


CONTRACT = Contract(
    id="import",
    assumes="import speculators.data_generation works with the installed transformers",
    failures=(r"name 'torch' is not defined",),
    shims=(Shim(Attach.IMPORT, apply_import),),
    gate_outside="speculators' own import depends on the installed transformers, which vLLM's Python sources do "
    "not pin; each env's conformance run checks it",
    upstream=(
        "transformers 5 annotates PretrainedConfig.dtype with torch.dtype without importing torch there; "
        "first seen with the transformers vLLM 0.20.0 installs (CPU matrix)"
    ),
)
