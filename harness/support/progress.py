"""Progress lines for long work (downloads, multi-step runs): what, how far, elapsed, an estimate of what is
left; on stderr, at most one line every few seconds, so minutes never pass in silence."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(
        self, what: str, total: float | None, unit: str = "MB", scale: float = 1e6, every_s: float = 3.0, stream=None
    ):
        self.what, self.total, self.unit, self.scale, self.every_s = what, total, unit, scale, every_s
        self.stream = stream or sys.stderr
        self.started = self.last = time.monotonic()
        self.done = 0.0

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        text = f"{self.what}: {self.done / self.scale:.1f}"
        if self.total:
            text += f" of {self.total / self.scale:.1f} {self.unit}"
            if self.done and self.done < self.total:
                text += f", ~{elapsed * (self.total - self.done) / self.done:.0f} s left"
        else:
            text += f" {self.unit}"
        return text + f", {elapsed:.0f} s elapsed"

    def advance(self, amount: float) -> None:
        self.done += amount
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            print(self.line(), file=self.stream, flush=True)

    def finish(self) -> None:
        print(self.line() + " (done)", file=self.stream, flush=True)
