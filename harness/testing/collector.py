"""What the session observed, gathered in the controlling process from each test's `user_properties` (so
it works whether or not pytest-xdist runs the tests elsewhere)."""

from __future__ import annotations

import time

OBS, E2E, META, NOTE, PROOF = "harness.observation", "harness.e2e", "harness.meta", "harness.note", "harness.proof"
STARTS = "harness.generator_starts"


class Collector:
    def __init__(self):
        self.observations: dict[str, dict] = {}
        self.e2e: list[dict] = []
        self.meta: dict = {}
        self.notes: list[str] = []
        self.tiers: dict[str, dict] = {}
        self.tests: dict[str, float] = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}  # and wall_s
        self.started = time.time()
        self.proofs: dict[str, dict] = {}
        self.skips: list[dict] = []
        self.collected: list[str] = []
        #: the test files a complete run covers, as they were when the session started (a file added while it
        #: runs is not something this run left out)
        self.suite_files: dict[str, list[str]] | None = None
        self.deselected = 0
        self.interrupted: str | None = None
        self.durations: dict[str, float] = {}  # per test: setup + call + teardown
        self.starts: list[float] = []  # every generator start-up of the session, in seconds (any process)
        self.last_report: dict | None = None  # the report this process wrote (the CLI reads its status)


COLLECTOR = Collector()
