"""What the harness extracts from and with: tiny checkpoints generated offline from `fixtures/models/` (`models`),
the prompts they run on (`prompts`), the batches that make a probe meaningful (`batches`: straddling a step,
unequal, repeated), the transformers forward every extraction is held against (`reference`), and the speculators
releases the client axis drives (`releases`)."""
