"""Compatibility harness and conformance suite for speculators' in-process hidden-state generator x vLLM."""
