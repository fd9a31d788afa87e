"""The harness's own tests. They run without vLLM (tox env `unit`)."""
