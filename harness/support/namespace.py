"""Run speculators' own code with some of the names it looks up replaced.

speculators 0.3.0's generator and worker extension look up vLLM names (`Scheduler`, `Request`,
`SchedulerConfig`, ...) in their module globals at call time. Rather than editing speculators or
patching vLLM for the whole process, `rebind()` makes a subclass whose methods are speculators'
very code objects, given a copy of the module globals in which the shimmed names are replaced.
The unshimmed class stays untouched, so speculators-as-shipped and speculators-through-shims can
run side by side in one process (which is how each shim is proven needed).
"""

from __future__ import annotations

import sys
import types
from typing import Any


def _with_globals(fn: types.FunctionType, module_globals: dict[str, Any]) -> types.FunctionType:
    """`fn`'s very code object, resolving its globals in `module_globals`."""
    out = types.FunctionType(fn.__code__, module_globals, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__qualname__ = fn.__qualname__
    out.__doc__ = fn.__doc__
    out.__module__ = fn.__module__
    return out


def rebind(cls: type, overrides: dict[str, Any], name: str | None = None, extra: dict | None = None) -> type:
    """Subclass `cls`; its functions run `cls`'s code with `overrides` in place of module globals.

    `extra` adds or overrides methods of the subclass itself (written by us, in our module).
    """
    module_globals = dict(vars(sys.modules[cls.__module__]))
    unknown = sorted(k for k in overrides if k not in module_globals)
    if unknown:
        # A name speculators no longer looks up means the shim no longer applies: say so.
        raise KeyError(f"{cls.__module__} has no global(s) {unknown} to shim")
    module_globals.update(overrides)
    body: dict[str, Any] = {
        attr: _with_globals(value, module_globals)
        for attr, value in vars(cls).items()
        if isinstance(value, types.FunctionType)
    }
    body.update(extra or {})
    body.setdefault("__module__", (extra or {}).get("__module__", cls.__module__))
    return type(name or cls.__name__, (cls,), body)


class TorchProxy(types.ModuleType):
    """`torch`, except for the attributes given; used where speculators calls `torch.cuda.*` directly."""

    def __init__(self, real: types.ModuleType, **replaced: Any):
        super().__init__(real.__name__)
        self.__dict__["_real"] = real
        self.__dict__.update(replaced)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.__dict__["_real"], item)
