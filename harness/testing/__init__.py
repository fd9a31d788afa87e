"""Testing support: the pytest plugin, recording and the strict expectation check, leak checks, the env report,
the GPU tier's options and marks."""
