"""What the harness extracts from: tiny checkpoints generated offline from `fixtures/models/` (`models`), the
prompts they run on (`prompts`), and the transformers forward every extraction is held against (`reference`)."""
