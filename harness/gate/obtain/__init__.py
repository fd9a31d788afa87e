"""Step 1 of the gate: the two sides it compares, as sources: what it was asked, checked first (`inputs`: flags and
lock files), what `--to`/`--from` may name (`artifacts`), a team's pin read from its lock file (`pin`), and the last
known good build when `--from` is not given (`baseline`)."""
