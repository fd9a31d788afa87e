"""What differs between two runs inside a quoted error or log line, and the same text with those tokens replaced.

A vLLM worker's error carries its pid, the log line's clock time, a temporary folder's random name, a port the
OS picked, a memory address, the random suffix vLLM appends to a request id. `text()` replaces exactly those and
keeps the message, the file:line and the exception type, so the same failure reads the same in every run; the
contracts' attempts, the test recordings and the reports all pass their evidence through it
(harness.reporting.stable builds the reports' comparisons on it).
"""

from __future__ import annotations

import re

#: Volatile tokens inside quoted errors and log lines, and what they become. Order matters: a temporary path
#: may hold a request id, and is rewritten first.
_VOLATILE = (
    # (VllmWorker pid=31622), (EngineCore_DP0 pid=123): the process id of whoever logged the line.
    (re.compile(r"\bpid=\d+"), "pid=<pid>"),
    # vLLM's log prefix: "ERROR 12-04 04:25:43 [file.py:783]" (optionally with milliseconds).
    (re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?"), r"\1 <time>"),
    # A folder tempfile made: /tmp/native-export-tu07okey/... (its random part is a tempfile suffix).
    (re.compile(r"(?<![\w/.-])/(?:tmp|var/tmp|dev/shm)/[^\s/'\"()\]]+"), "<tmp>"),
    # Request ids with vLLM's random suffix ("0-9590042c"), as they appear in connector file names.
    (re.compile(r"(?<![\w-])(\d+)-[0-9a-f]{8}(?=\.safetensors\b)"), r"\1-<id>"),
    # Ports on the loopback a server was started on.
    (re.compile(r"\b(127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\]):\d{2,5}\b"), r"\1:<port>"),
    # Memory addresses in reprs and tracebacks.
    (re.compile(r"\b0x[0-9a-fA-F]{6,16}\b"), "0x<addr>"),
)


def text(value: str) -> str:
    """`value` with pids, log clock times, temporary paths, request-id suffixes, ports and addresses replaced."""
    for pattern, replacement in _VOLATILE:
        value = pattern.sub(replacement, value)
    return value


def map_strings(value, fn):
    """`value` (nested dicts and lists) with every string through `fn`; other values unchanged."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [map_strings(v, fn) for v in value]
    return value


def stable(value):
    """Every string in a report through `text()`."""
    return map_strings(value, text)
