"""Step 3 of the gate: findings against the allow list (`allowlist`), each contract's status, the verdict and its
exit code, and the report's content (`verdict`)."""
