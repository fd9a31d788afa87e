"""speculators >= 0.5's server path without a server: how each release's client is called (read from its real
wheel), the client contract rows drawn from a server_check report, and a subset run's rows in the matrix."""

from __future__ import annotations

import json

import pytest

from harness.clients import contracts as cc
from harness.clients.vllm_client import ClientApi, load_client
from harness.envs import tox_envs
from harness.reporting import matrix


@pytest.mark.parametrize(
    "version, takes_item, waits",
    [("0.5.0", False, False), ("0.6.0", True, True), ("0.8.0", True, True), ("0.9.0", True, True)],
)
def test_each_release_is_called_as_its_code_says(version, takes_item, waits):
    api = ClientApi.of(load_client(version))
    assert (api.takes_item, api.waits_on_locks) == (takes_item, waits)


def test_a_client_with_an_unknown_signature_is_refused():
    import types

    module = types.ModuleType("future_client")
    module.generate_hidden_states = lambda client, model, prompts, timeout=None: ""
    with pytest.raises(LookupError, match=r"future_client.generate_hidden_states.*neither token_ids nor client_item"):
        ClientApi.of(module)


def _rep(**kw) -> dict:
    rep = {"model": "tiny-llama", "native_ids": [1, 3, 5, 6], "clients": {}}
    rep.update(kw)
    return rep


def _outcomes(obs) -> dict:
    return {o.key: str(o.outcome) for o in obs}


def test_a_server_that_did_not_start_breaks_serve_and_nothing_after_it_is_observed():
    obs = cc.observe_model(_rep(serve={"started": False, "error": "vllm serve exited with exit code 1: ValueError"}))
    assert _outcomes(obs) == {
        "client-serve[tiny-llama]": "broken",
        "client-http[tiny-llama]": "n/a",
        "client-files[tiny-llama]": "n/a",
        "client-lastlayer[tiny-llama]": "n/a",
    }
    assert "ValueError" in obs[0].reason and "client-serve[tiny-llama]" in obs[1].reason


def _served(**kw) -> dict:
    http = {
        "ok": True,
        "prompt_token_ids_echoed": True,
        "kv_transfer_params_keys": ["hidden_states_path"],
        "file_key": "hidden_states_path",
        "file": {"ok": True, "holds": True, "layout": {"hidden_states": [[9, 4, 8], "float32"]}, "lock": "none"},
    }
    per_id = {"6": {"speculators_id": 5, "max_abs_diff": 0.0, "rel_diff": 0.0}}
    rep = _rep(
        serve={"started": True, "start_s": 9.0, "writer": "w", "args": []},
        http=http,
        last_layer_is_final_output=True,
        clients={"0.9.0": {"agrees": True, "per_native_id": per_id}},
    )
    rep.update(kw)
    return rep


def test_a_working_server_holds_every_row_and_each_failure_breaks_its_own_row():
    assert set(_outcomes(cc.observe_model(_served())).values()) == {"native"}
    rep = _served()
    rep["http"]["prompt_token_ids_echoed"] = False
    assert _outcomes(cc.observe_model(rep))["client-http[tiny-llama]"] == "broken"
    rep = _served()
    rep["http"]["file"]["holds"] = False
    assert _outcomes(cc.observe_model(rep))["client-files[tiny-llama]"] == "broken"
    died = cc.observe_model(_served(failure="engine died in propose"))
    got = _outcomes(died)
    assert got["client-lastlayer[tiny-llama]"] == "broken" and got["client-serve[tiny-llama]"] == "native"
    assert "native id 6 exported" in died[-1].reason and "engine died in propose" in died[-1].reason
    assert (
        _outcomes(cc.observe_model(_served(last_layer_is_final_output=False)))["client-lastlayer[tiny-llama]"]
        == "broken"
    )


def _report(vllm: str, at: str, contracts=(), e2e=(), subset=None, failed=0) -> dict:
    return {
        "status": "pass",
        "versions": {"vllm": vllm},
        "generated_at": at,
        "tiers": {},
        "skips": [],
        "tests": {"wall_s": 1.0, "failed": failed},
        "selection": {"subset": subset or []},
        "contracts": [{"contract": k, "outcome": o, "expected": o, "proof": {"result": "n/a"}} for k, o in contracts],
        "e2e": [{"model": m, "check": "c", "result": r, "measured": "x"} for m, r in e2e],
    }


def test_a_subset_run_adds_only_the_rows_its_build_s_complete_report_lacks(tmp_path):
    ver, meta = next(iter(tox_envs.versions().items()))
    env = meta["env"]
    (tmp_path / f"{env}.json").write_text(
        json.dumps(_report(ver, "2026-12-01", [("sched", "shimmed")], [("m", "pass")]))
    )
    sub = _report(
        ver,
        "2026-12-03",
        [("sched", "native"), ("client-serve[m]", "native")],
        [("client0.9.0:m", "pass")],
        subset=["not run: the other suites"],
    )
    sub["platform"] = {"cpu": "AMD EPYC (avx2)"}  # each added row names the run and the machine that observed it
    (tmp_path / f"{env}.incomplete.json").write_text(json.dumps(sub))
    m = matrix.merge(tmp_path)
    col = m["columns"][0]
    assert col["status"] == "pass" and col["supplement"]["rows_added"] == ["client-serve[m]", "e2e[client0.9.0:m]"]
    assert m["rows"]["sched"][ver]["outcome"] == "shimmed" and "run" not in m["rows"]["sched"][ver]
    assert m["rows"]["client-serve[m]"][ver]["run"] == "subset run 2026-12-03 on AMD EPYC (avx2)"
    sub["tests"]["failed"] = 1  # a failing subset fails the column
    (tmp_path / f"{env}.incomplete.json").write_text(json.dumps(sub))
    assert matrix.merge(tmp_path)["columns"][0]["status"] == "fail"
    for stale in (
        dict(sub, generated_at="2026-11-30"),
        dict(sub, versions={"vllm": "9.9.9"}),
        dict(sub, interrupted="KeyboardInterrupt"),
    ):
        (tmp_path / f"{env}.incomplete.json").write_text(json.dumps(stale))
        m = matrix.merge(tmp_path)
        assert m["columns"][0]["supplement"] is None and "client-serve[m]" not in m["rows"]
