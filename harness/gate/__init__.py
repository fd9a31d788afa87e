"""The pre-upgrade gate: can speculators 0.3.0 (through the harness's shims) move to another vLLM?

Its static half reads vLLM's released Python sources and never imports them:

* `sources` fetches one version's `vllm/**/*.py` from the package index into a cache;
* `used_surface` holds what speculators uses of vLLM, generated from speculators' source into a fixture;
* `tree` loads just the modules a check needs with griffe; `static` compares the used surface
  between two versions and `checks` adds targeted reads of behaviour, defaults and return shapes,
  as `facts`;
* `coverage` says which contract owns each fact and which shim covers each kind of change,
  `allowlist` accepts a finding until a date, `verdict` decides and writes the reports;
* `cli` is `python -m harness gate` (also `python -m harness.gate`); `dynamic` is the hook for
  the run-it-for-real half.
"""
