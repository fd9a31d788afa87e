"""The vLLM environments: tox envs rendered from the matrix file, and the fix-ups a CPU build needs."""
