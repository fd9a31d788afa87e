"""Reachability: the vLLM code each contract watches, followed through calls, and what changed on it.

Patterns catch the shapes they were written for; a nightly moves the same step behind a helper, sends it by
`collective_rpc("name")`, assigns an attribute in another method or moves a sort into the scheduler. So the gate
also reads paths: each watched path starts at named entry points (EngineCore's set-up, the worker's and runner's
construction, load and execute path, the scheduler's request path) and follows, per platform, what a call reaches:

* `self.m()`: the method `m` of the concrete class being followed (its MRO), so a subclass's override counts;
* `super().m()`: the next definition of `m` after the class the call is written in;
* `self.<attr>.m()`: the class of the attribute, from `self.<attr> = Cls(...)` or `self.<attr>: Cls` in the class
  and its bases, else its role (`ROLES`: the executor, the worker, the model runner, the scheduler);
* `collective_rpc("name")` (on anything, the method as first argument or `method=`): the worker's method `name`;
* `f()` and `Cls()`: a function or class of the watched packages, through the module's imports.

The concrete classes are the platform's (`PLATFORMS`): the CUDA worker and the CPU worker, each with the runners it
builds by default (`harness.vllm_source.runners`), since CPU and CUDA builds run different code. Calls under a condition on
a feature speculators' configuration never turns on (`NEVER_ENABLED`) are not followed: that code never runs for it.

A reachable function is compared with the baseline's function of the same name by its syntax tree with docstrings
(and so comments and formatting) left out. Unchanged is read and fine; a signature that only gained optional
parameters, body unchanged, is compatible; any other difference, or a function the baseline does not have, is a
`changed-unclassified` finding with file:line and the diff, unless one of the targeted checks already reported a
finding inside that function (then that check classified it). Such a finding never lets the gate say SAFE.
"""

from harness.gate.read.reach.compare import Change, changes, compatible_signature, review, spans, watched
from harness.gate.read.reach.follow import Platform, platform_roles, reachable
from harness.gate.read.reach.index import Fn, Index
from harness.gate.read.reach.scope import KIND, PACKAGES, PLATFORMS, ROLES, WATCH

__all__ = [
    "KIND",
    "PACKAGES",
    "PLATFORMS",
    "ROLES",
    "WATCH",
    "Change",
    "Fn",
    "Index",
    "Platform",
    "changes",
    "compatible_signature",
    "platform_roles",
    "reachable",
    "review",
    "spans",
    "watched",
]
