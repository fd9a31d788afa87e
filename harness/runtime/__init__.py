"""What users import: speculators' generator made to run on the installed vLLM (`generator`), the executor view
and worker extension that apply the contracts' shims (`executor_view`, `worker`), the fast path (`fast_path`), and
the way captured states travel from the workers: host shared memory (`transport`) or the worker's GPU
(`device_hand_off`)."""
