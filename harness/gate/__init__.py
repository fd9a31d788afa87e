"""The pre-upgrade gate: can speculators (through the harness's shims) move to another vLLM? Read without
installing or importing either side; each package is one step of the path a verdict takes:

1. `obtain`: the two sides as sources: a release, a wheel, a tree or an index build (`artifacts`), the team's pin
   from its lock file (`pin`), or the last known good build (`baseline`); sources are cached by harness.envs.sources;
2. `read`: what each side shows, as facts owned by contracts: speculators' used surface and the shims' surface
   (`static`, with `coverage` saying which contract owns what), each contract's own checks (`contract_checks`),
   the code each contract watches followed through calls (`reach`), the server path's needs (`client`), and the
   CPU env's run where one exists (`dynamic`);
3. `decide`: findings against the allow list (`allowlist`), each contract's status and the verdict (`verdict`);
4. `cli`: `python -m harness gate` (also `python -m harness.gate`) runs the steps and writes the report.

`sweeps` runs the gate over many builds: every consecutive pair of releases (`pairs`), the release that changed
a contract (`bisect`), and one-change copies of real releases that judge the gate itself (`mutants`). How vLLM's
sources are read is harness.vllm_source, shared with the contracts' checks.
"""
