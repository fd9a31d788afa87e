"""The gate judged the way mutation testing judges a test suite: one-change copies of real vLLM releases.

Each operator applies one kind of change a nightly brings, at every eligible site of a real release's sources
(sampled to a budget, deterministically), and the gate runs on the release against its copy. A protocol mutant
must not come back SAFE (flagged); a neutral one must (a false alarm otherwise). Operators:

protocol
* `insert-executor-call`: a new set-up step `self.model_executor.<step>()` at the top of an EngineCore function on
  the set-up path;
* `insert-helper-call`: the same step in a new helper method of the class, called at the top of a function on the
  set-up or worker path (EngineCore, the executor, the worker, the runner);
* `insert-rpc-by-name`: the step sent by name, `collective_rpc("<step>")`, from an EngineCore or executor function;
* `rename-attribute`: an attribute the harness's shims or speculators read, renamed where a worker, runner or
  input batch assigns it on its construction path;
* `add-sort`: the scheduler's running requests or a step's scheduled-token map sorted by size, at the top of a
  function on the request path (scheduler, input batch, runner);
* `move-sort`: where a runner already sorts a step's requests (0.34's V2 runner), the sort removed there and put
  into `Scheduler.schedule`.

neutral
* `docstring-edit`, `comment-edit`: text only, in a function on a watched path;
* `optional-kwarg`: a keyword-only parameter with a default added to a function on a watched path, body unchanged;
* `new-module`: a module nothing imports.

The sites come from the release itself (its set-up, worker and request paths as `harness.gate.read.reach` draws them, the
attribute definitions, the functions that touch a step's requests), so an operator is applied wherever its kind of
change can land, not where the gate was tuned. A mutant whose source no longer parses is dropped (counted).
"""

from harness.gate.sweeps.mutants.judging import judge, run
from harness.gate.sweeps.mutants.operators import NEUTRAL, PROTOCOL, Mutant, generate

__all__ = ["NEUTRAL", "PROTOCOL", "Mutant", "generate", "judge", "run"]
