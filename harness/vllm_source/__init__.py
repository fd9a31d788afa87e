"""Reading a vLLM release's Python sources without importing them: the modules a check asks for as syntax trees
(`tree`), which model runner a worker builds and how it orders a step (`runners`), the engine's set-up sequence
(`engine_setup`), where a call of speculators' code lands (`calls`), the surfaces speculators and the harness's
shims use (`used_surface`, `shim_surface`), and what one version shows, as facts (`facts`, `lookups`). The
contracts' gate checks are written in these terms, and the gate runs them."""
