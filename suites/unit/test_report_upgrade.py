"""Reports of the schema that keyed per-model rows by family are read with fixture keys; the matrix does not call
a report `pass` for rows the suite gained after it was written."""

from __future__ import annotations

import json

from harness import contracts
from harness.reporting import matrix, report


def _v1_report() -> dict:
    rows = [
        {
            "contract": k.replace("[tiny-llama]", "[llama]")
            .replace("[tiny-deepseek-v3]", "[deepseek_v3]")
            .replace("[tiny-kimi-k25]", "[kimi_k25]"),
            "outcome": "native",
            "proof": {"result": "not needed here"},
        }
        for k in contracts.keys()  # noqa: SIM118 - the registry's keys(), not a dict
        if "tiny-qwen3" not in k
    ]
    return {
        "schema": "harness-env-report/1",
        "contracts": rows,
        "mismatched": [],
        "unexpected": [],
        "not_observed": ["embed[llama]"],
        "stale_expectations": [],
        "tiers": {"contracts": {}},
    }


def test_schema_1_rows_are_rekeyed_by_fixture(tmp_path):
    path = tmp_path / "vllm099.json"
    path.write_text(json.dumps(_v1_report()))
    rep = report.read(path)
    keys = {c["contract"] for c in rep["contracts"]}
    assert "embed[tiny-llama]" in keys and "mla[tiny-kimi-k25]" in keys and "import" in keys
    assert not any(k.endswith(("[llama]", "[deepseek_v3]", "[kimi_k25]")) for k in keys)
    assert rep["not_observed"] == ["embed[tiny-llama]"] and rep["schema"] == report.SCHEMA


def test_a_report_older_than_a_fixture_is_not_pass():
    rep = report.upgrade(_v1_report())
    status, gaps = matrix._predates(rep, "pass", [])
    assert status == "incomplete"
    assert "embed[tiny-qwen3]" in gaps[0]["what"] and "embed[tiny-llama]" not in gaps[0]["what"]
    whole = dict(
        rep,
        contracts=rep["contracts"]
        + [
            {"contract": k}
            for k in contracts.keys()  # noqa: SIM118 - as above
            if "tiny-qwen3" in k
        ],
    )
    assert matrix._predates(whole, "pass", []) == ("pass", [])
