"""What a contract is, what a probe returns, and how an observation is classified.

A contract is one thing speculators 0.3.0 assumes about vLLM. Its probe drives the installed vLLM
twice: once the way speculators does (the *unshimmed* attempt) and, when that fails, once through
our shim (the *shimmed* attempt). The outcome follows from those two attempts alone:

* native  - speculators' own call works;
* shimmed - speculators' call fails with a failure this contract documents, and the shim works;
* broken  - anything else (an undocumented failure, or a shim that does not restore the contract);
* n/a     - the contract does not apply to this model/platform (said with a reason).
"""

from __future__ import annotations

import enum
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.support import volatile

#: The error type of an attempt that could not be made (a probe whose subject did not run): a broken row, never a
#: pass, whose reason says what stopped it instead of a cause it does not know.
NOT_OBSERVED = "NotObserved"


class Outcome(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() of a member, which reports print
    NATIVE = "native"
    SHIMMED = "shimmed"
    BROKEN = "broken"
    NA = "n/a"

    def __str__(self) -> str:
        return self.value


def summarize(text: str, limit: int = 500) -> str:
    """An exception's text on one line (pydantic puts the field name on the second line), without the
    machine-specific path prefixes that `short_path` drops (an ImportError names the file it looked in)."""
    line = " | ".join(part.strip() for part in (text or "").strip().splitlines() if part.strip())
    line = strip_machine_paths(line)
    if len(line) <= limit:
        return line
    cut = line[: limit - 2]
    return cut[: cut.rfind(" ")] + " …" if " " in cut else cut + " …"  # never mid-word


_SITE_PACKAGES = re.compile(r"/[^\s'\"()]*/site-packages/")


def strip_machine_paths(text: str) -> str:
    """`short_path` applied inside free text: `<anything>/site-packages/`, the repo root and this process's other
    import roots (a `--target` install on PYTHONPATH such as the GPU machine's /tmp/site) are dropped, so a
    module reads as its import path (`vllm/v1/core/sched/scheduler.py`)."""
    import sys

    from harness.support.paths import SOURCE_ROOT

    text = _SITE_PACKAGES.sub("", text)
    roots = {str(SOURCE_ROOT)} | {p.rstrip("/") for p in sys.path if p.startswith("/") and p.count("/") > 1}
    for root in sorted(roots, key=len, reverse=True):
        text = text.replace(root + "/", "")
    return text


def short_path(filename: str) -> str:
    """A traceback file name without the machine-specific prefix (site-packages/ or the repo root)."""
    from harness.support.paths import SOURCE_ROOT

    if "site-packages/" in filename:
        return filename.split("site-packages/")[-1]
    root = str(SOURCE_ROOT) + "/"
    return filename[len(root) :] if filename.startswith(root) else filename


def raise_site(frame: traceback.FrameSummary) -> str:
    """Where an exception was raised, as reports quote it: a third-party frame by file and line (fixed for the
    installed release, and what a reader looks up), the harness's own by file and function (its lines move with
    every edit, and a report must not change when the code only moved)."""
    path = short_path(frame.filename)
    return f"{path}:{frame.name}" if path.startswith("harness/") else f"{path}:{frame.lineno}"


def resolve(dotted: str):
    """The object a dotted reference names (`harness.runtime.executor_view.ExecutorView.execute_model`); LookupError if
    no importable module in it holds the rest. Shim references are resolved with it (a unit test, the gate)."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                raise LookupError(f"{dotted}: {'.'.join(parts[:i])} has no {'.'.join(parts[i:])}")
            obj = getattr(obj, name)
        return obj
    raise LookupError(f"{dotted}: no importable module in it")


@dataclass
class Attempt:
    """One call into the installed vLLM: did it work, and if not, what did it raise."""

    ok: bool
    error_type: str | None = None
    error: str | None = None
    detail: dict = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        # the error as every later excerpt quotes it: pids, log times, temp paths normalised before any cut
        if isinstance(self.error, str):
            self.error = volatile.text(self.error)

    @classmethod
    def run(cls, fn: Callable[[], Any]) -> tuple[Attempt, Any]:
        t0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - the exception is the observation
            tb = traceback.extract_tb(exc.__traceback__)
            where = raise_site(tb[-1]) if tb else ""
            message = summarize(str(exc)) or repr(exc)
            return cls(False, type(exc).__name__, message, {"raised_at": where}, time.perf_counter() - t0), None
        return cls(True, seconds=time.perf_counter() - t0), value

    @classmethod
    def failed(cls, error_type: str, error: str, **detail: Any) -> Attempt:
        return cls(False, error_type, error, detail)

    @property
    def text(self) -> str:
        if self.ok:
            return "ok"
        where = self.detail.get("raised_at")
        return f"{self.error_type}: {self.error}" + (f" @ {where}" if where else "")


def qualified_name(fn: Callable) -> str:
    """`module.qualname` of a function: how reports and the gate print a shim (and `resolve` finds it again)."""
    return f"{fn.__module__}.{fn.__qualname__}"


class Attach(str, enum.Enum):  # noqa: UP042 - as Outcome
    """Where in speculators' run a shim takes effect, and so the signature of its function. Each site applies
    every selected shim attached there in one loop (harness.runtime: generator, executor_view, worker)."""

    #: fn(): before speculators is imported, in the driver and in each worker process.
    IMPORT = "import"
    #: fn(): the process environment, before the executor starts (decided per model by the contract's probe).
    ENV = "env"
    #: fn(ns, current, state): replaces names speculators' generator module looks up (`ns`; `current(name)` is
    #: what the name resolves to so far, so shims on one name compose in registry order).
    GENERATOR = "generator"
    #: fn(view, state): once, right after the executor speculators holds has started.
    EXECUTOR = "executor"
    #: fn(view, reply, unique_reply_rank) -> reply: every collective_rpc reply speculators receives.
    RPC_REPLY = "rpc-reply"
    #: fn(view, output) -> engaged: after every execute_model() speculators calls.
    STEP = "step"
    #: fn(view, state): once per batch, right after speculators resets the capture (its requests are added,
    #: no step has run yet).
    BATCH_START = "batch-start"
    #: fn(worker) -> engaged: in each worker, before speculators' capture set-up.
    WORKER = "worker"
    #: fn(ns, current, worker) -> engaged: replaces names speculators' worker extension looks up.
    WORKER_GLOBALS = "worker-globals"
    #: fn(worker) -> engaged: in each worker, after speculators' capture set-up.
    WORKER_AFTER = "worker-after"
    #: fn(worker, states) -> states: the captured states a worker hands to speculators' driver.
    WORKER_STATES = "worker-states"
    #: fn(worker, scheduler_output, rows) -> (total_rows, moves) | None: where one forward's captured rows go
    #: in the batch's hand-off, as (source row, destination row, count) moves, so that they can leave the
    #: device while the next step runs (harness.runtime.transport.Stream). A contract whose WORKER_STATES shim
    #: moves rows must also say where here; None: not known, the rows leave after the last step.
    WORKER_ROWS = "worker-rows"
    #: fn(worker): when speculators resets the capture between batches.
    WORKER_RESET = "worker-reset"


@dataclass(frozen=True)
class Shim:
    """One piece of a contract's shim: the function (an object, never a name) and where it attaches."""

    attach: Attach
    fn: Callable
    note: str = ""  # e.g. the variable an ENV shim sets

    @property
    def name(self) -> str:
        return qualified_name(self.fn) + (f" ({self.note})" if self.note else "")


def _always(_finding) -> bool:
    return True


@dataclass(frozen=True)
class GateCover:
    """For the static gate: a kind of change in vLLM's sources this contract's shim handles (harness.gate)."""

    kind: str  # the finding's kind ("keyword-removed", "import-moved", ...)
    fn: Callable  # the code that handles it: one of the contract's shim functions (or, C-layer, its guard)
    reason: str  # what that code does about this kind of change
    when: Callable = _always  # the exact change it handles: a predicate on the finding
    condition: str = ""  # `when`, in words

    @property
    def shim(self) -> str:
        return qualified_name(self.fn)


@dataclass(frozen=True)
class Contract:
    """A contract's identity: what speculators assumes, how its unshimmed path fails, which shim fixes it."""

    id: str
    assumes: str
    failures: tuple[str, ...]
    shims: tuple[Shim, ...] = ()
    side: str = "driver"  # "driver": the generator process; "worker": inside vLLM's worker processes
    #: How the report words a native / a broken outcome (contracts that are not speculators' calls, such as
    #: vLLM's own export in harness.native, say what holds instead).
    native_says: str = "speculators' own call works"
    broken_says: str = "no shim restores it"
    #: The upstream change that forced the contract (vLLM PR or release), cited where the shim is.
    upstream: str = ""
    #: For the static gate: the parts of speculators' vLLM surface this contract owns, as (import symbol glob,
    #: chain after it or None for any chain); the kinds of change its shim covers; or why no reading of vLLM's
    #: sources can decide it (`gate_outside`: the gate then takes each env's observed outcome).
    gate_owns: tuple[tuple[str, str | None], ...] = ()
    #: Targeted reads of vLLM's sources for this contract: fn(tree, used, follower) -> list of harness.gate Facts.
    gate_checks: tuple[Callable, ...] = ()
    gate_covers: tuple[GateCover, ...] = ()
    gate_outside: str | None = None

    @property
    def shim(self) -> str | None:
        """The shim's name as reports and the gate print it (its first function; None: no shim)."""
        return self.shims[0].name if self.shims else None

    def shims_at(self, attach: Attach) -> list[Shim]:
        return [s for s in self.shims if s.attach is attach]

    def documented(self, attempt: Attempt) -> bool:
        return not attempt.ok and any(re.search(p, attempt.text) for p in self.failures)


@dataclass
class Observation:
    contract: Contract
    unshimmed: Attempt
    shimmed: Attempt | None = None
    facts: dict = field(default_factory=dict)
    not_applicable: str | None = None
    subject: str | None = None  # e.g. the model architecture for per-model contracts

    @classmethod
    def of(cls, contract: Contract, unshimmed: Attempt, shimmed: Attempt | None, facts: dict, **kw) -> Observation:
        """The usual observation: a shimmed attempt is kept only where speculators' own call failed (where
        it works, what the shim would do says nothing about this vLLM)."""
        return cls(contract, unshimmed, None if unshimmed.ok else shimmed, facts, **kw)

    @property
    def key(self) -> str:
        return f"{self.contract.id}[{self.subject}]" if self.subject else self.contract.id

    @property
    def outcome(self) -> Outcome:
        return classify(self)[0]

    @property
    def reason(self) -> str:
        return classify(self)[1]

    def to_json(self) -> dict:
        return {
            "contract": self.key,
            "assumes": self.contract.assumes,
            "outcome": str(self.outcome),
            "reason": self.reason,
            "shim": self.contract.shim if self.outcome is Outcome.SHIMMED else None,
            "unshimmed": asdict(self.unshimmed),
            "shimmed": asdict(self.shimmed) if self.shimmed else None,
            "facts": self.facts,
        }


def classify(obs: Observation) -> tuple[Outcome, str]:
    if obs.not_applicable:
        return Outcome.NA, obs.not_applicable
    if obs.unshimmed.ok:
        return Outcome.NATIVE, obs.contract.native_says
    if obs.unshimmed.error_type == NOT_OBSERVED:
        return Outcome.BROKEN, f"not observed: {obs.unshimmed.error}"
    if not obs.contract.documented(obs.unshimmed):
        return Outcome.BROKEN, f"undocumented failure: {obs.unshimmed.text}"
    if obs.shimmed is None or obs.contract.shim is None:
        return Outcome.BROKEN, f"{obs.contract.broken_says}: {obs.unshimmed.text}"
    if not obs.shimmed.ok:
        return Outcome.BROKEN, f"shim {obs.contract.shim} does not restore it: {obs.shimmed.text}"
    return Outcome.SHIMMED, f"{obs.unshimmed.text} -> restored by {obs.contract.shim}"
