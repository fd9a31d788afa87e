"""How a vLLM release is obtained and installed: its Python sources fetched into a cache, never installed
(`sources`), released speculators and hs-connectors wheels unpacked (`wheels`), the tox envs rendered from the
matrix file (`tox_envs`), CPU builds from source (`source_build`, `cpu_runner`), and the fix-ups a CPU build needs
(`envfix`)."""
