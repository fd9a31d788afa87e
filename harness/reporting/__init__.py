"""What a run says: the per-vLLM expectations, the env report, and the attribution of broken cells."""
