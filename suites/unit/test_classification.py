"""How an observation becomes native / shimmed / broken / n/a."""

from __future__ import annotations

from harness.contracts.base import Attach, Attempt, Contract, Observation, Outcome, Shim, classify


def shim_x(ns, current, state) -> None:
    """A shim for the classification tests (never applied)."""


C = Contract("x", "x works", failures=(r"TypeError: .*'block_size'",), shims=(Shim(Attach.GENERATOR, shim_x),))


def test_native_when_speculators_call_works():
    assert classify(Observation(C, Attempt(True)))[0] is Outcome.NATIVE


def test_shimmed_needs_the_documented_failure_and_a_working_shim():
    fail = Attempt.failed("TypeError", "missing 1 required positional argument: 'block_size'")
    assert classify(Observation(C, fail, Attempt(True)))[0] is Outcome.SHIMMED
    outcome, reason = classify(Observation(C, fail, Attempt.failed("RuntimeError", "boom")))
    assert outcome is Outcome.BROKEN and "does not restore" in reason


def test_undocumented_failure_is_broken_even_if_the_shim_passes():
    other = Attempt.failed("ImportError", "cannot import name 'Scheduler'")
    outcome, reason = classify(Observation(C, other, Attempt(True)))
    assert outcome is Outcome.BROKEN and reason.startswith("undocumented failure")


def test_no_shim_means_broken():
    c = Contract("y", "y works", failures=(r"boom",))
    assert classify(Observation(c, Attempt.failed("RuntimeError", "boom"), None))[0] is Outcome.BROKEN


def test_not_applicable_wins():
    assert classify(Observation(C, Attempt(True), not_applicable="no MLA"))[0] is Outcome.NA


def test_attempt_records_where_it_raised():
    att, value = Attempt.run(lambda: {}["k"])
    assert not att.ok and att.error_type == "KeyError" and "test_classification.py" in att.detail["raised_at"]
    assert value is None


def test_a_raise_in_the_harness_is_quoted_by_function_elsewhere_by_line():
    """Reports must not change when the harness's code only moved; a third-party line is fixed per release."""
    from harness.contracts.base import resolve

    att, _ = Attempt.run(lambda: resolve("harness.no_such_module.thing"))  # raised inside harness/contracts/base.py
    where = att.detail["raised_at"]
    assert not att.ok and where.startswith("harness/") and not where.rsplit(":", 1)[1].isdigit()
    att, _ = Attempt.run(lambda: int("x"))  # raised here, outside harness/: file and line
    assert att.detail["raised_at"].rsplit(":", 1)[1].isdigit()
