"""The gate's default reference (the last known good vLLM) and per-commit dev versions."""

import json

from packaging.version import Version

from harness.envs import sources, tox_envs
from harness.gate.obtain.baseline import WRITTEN_FOR, last_known_good


def _report(status_pass: bool) -> dict:
    row = {
        "contract": "sched",
        "outcome": "native",
        "expected": "native",
        "reason": "r",
        "proof": {"result": "not needed here", "evidence": "x"},
    }
    return {
        "status": "pass",
        "contracts": [row],
        "mismatched": [],
        "unexpected": [],
        "stale_expectations": [],
        "not_observed": [],
        "tests": {"passed": 1, "failed": 0 if status_pass else 1},
        "skips": [],
        "selection": {"subset": [], "stopped_early": None},
        "interrupted": None,
    }


def test_newest_passing_report_is_the_reference(tmp_path):
    envs = list(tox_envs.versions().items())
    (older_v, older), (_newer_v, newer) = envs[2], envs[5]
    (tmp_path / f"{older['env']}.json").write_text(json.dumps(_report(True)))
    (tmp_path / f"{newer['env']}.json").write_text(json.dumps(_report(False)))  # fails: not a reference
    version, why = last_known_good(tmp_path, verified=tmp_path / "none.toml")
    assert version == older_v and f"reports/{older['env']}.json" in why


def test_a_pinned_verified_version_wins(tmp_path):
    pin = tmp_path / "verified.toml"
    pin.write_text('[vllm]\nversion = "0.33.0.dev4+g1234abcd"\ncommit = "1234abcd"\nverified = 2026-11-30\n')
    version, why = last_known_good(tmp_path, verified=pin)
    assert version == "0.33.0.dev4+g1234abcd" and "commit 1234abcd" in why and "verified 2026-11-30" in why


def test_nothing_passing_falls_back_to_the_version_speculators_was_written_for(tmp_path):
    assert last_known_good(tmp_path, verified=tmp_path / "none.toml")[0] == WRITTEN_FOR


def test_dev_versions_are_understood():
    v = "0.34.0.dev12+gabc1234.cu130"
    assert sources.normalize(v) == v and sources.dev_commit(v) == "abc1234"
    assert Version(v) < Version("0.34.0") and Version(v) > Version("0.33.9")
    assert sources.dev_commit("0.34.0") is None


def test_bisect_finds_a_change_made_and_later_undone_and_reads_each_release_once():
    """With no change at the newer end, every release between is read: the change made in 0.3 and undone in 0.5
    is named with both, not reported as "no finding"; a lasting change is bisected."""
    from harness.gate.sweeps.bisect import locate

    releases = ["0.1", "0.2", "0.3", "0.4", "0.5", "0.6"]
    read: list[str] = []

    def changed_in(versions):
        def changed(v):
            read.append(v)
            return v in versions

        return changed

    assert locate(releases, changed_in({"0.3", "0.4"})) == ("0.3", "0.2", "0.5")
    assert sorted(read) == sorted(set(read)), "a release was read twice"
    read.clear()
    assert locate(releases, changed_in({"0.4", "0.5", "0.6"})) == ("0.4", "0.3", None)
    assert len(read) < len(releases) - 1, "a lasting change is bisected, not read release by release"
    assert locate(releases, changed_in(set())) == (None, None, None)
