"""speculators >= 0.5's own path, end to end on this vLLM: each release's client (`vllm_client`, loaded from its
wheel) against a real `vllm serve` with the native export, compared with our extraction at the mapped ids.

One server per tiny model; the harness's raw request first, then every release in CLIENTS in turn. Rows:
- the server's contracts, `client-serve|http|files|lastlayer[<model>]` and `client-connectors` (hs-connectors'
  vLLM surface), held to the build's expectations (harness.clients.contracts);
- each release's result, `e2e[client<version>:<model>]`: `pass` where its files agree with ours within the native
  bound; where this vLLM cannot serve the export at all the row is expected `broken` (the reason in the
  expectations file; strict: if it starts working, the run fails until the file says so).
Without a native export every row is a declared n/a. On a CPU build the connector's CUDA-only writer is replaced
by harness.native.sync_writer (chosen by probing); `test_sync_writer_is_needed` proves the replacement needed
(vLLM's own connector fails as documented) and the agreement proves it sufficient.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.clients import contracts as cc
from harness.native import availability
from harness.native.layer_ids import map_layer_ids
from harness.subjects.releases import CLIENT, CLIENT_MODELS, CLIENTS, client_row
from harness.testing.recording import check_expected, not_applicable


def _check(version: str) -> str:
    return f"speculators {version} via vllm serve agrees with ours at the mapped ids"


def _no_export() -> str | None:
    ok, why = availability()
    return None if ok else why


def test_connectors_contract(record_observation):
    """`client-connectors`: hs-connectors' imports and subclasses against the installed vLLM (n/a without the export)."""
    import vllm

    from harness.gate.read.client import CONNECTORS_OF
    from harness.installed.connectors_surface import fixture_path

    na = _no_export()
    if na:
        record_observation(cc.observe(cc.CONNECTORS, [], not_applicable=na))
        not_applicable(na)
    record_observation(cc.observe_connectors(fixture_path(CONNECTORS_OF[CLIENT]), Path(vllm.__file__).parent.parent))


@pytest.mark.parametrize("name", CLIENT_MODELS)
def test_clients_agree_with_ours(name, record_e2e, record_observation, expectations, numerics_expected):
    from harness import native as nx
    from harness.clients import server_check
    from harness.subjects import models

    na = _no_export()
    if na:
        for c in cc.PER_MODEL:
            record_observation(cc.observe(c, [], subject=name, not_applicable=na))
        for v in CLIENTS:
            record_e2e(client_row(name, v), _check(v), "n/a", na)
        not_applicable(na)
    rep = server_check.run(name)
    model = models.build(name)
    chunked = nx.probe_chunked_prefill(model, map_layer_ids(rep["native_ids"], model.num_layers, to="speculators"))
    failures = []
    for obs in cc.observe_model(rep, chunked):
        record_observation(obs, hold=False)  # every row recorded before any is held
        try:
            check_expected(obs, expectations)
        except (AssertionError, pytest.fail.Exception) as e:
            failures.append(str(e))
    for v in CLIENTS:
        res = rep["clients"][v]
        said = f"{res['verdict']} ({res.get('tolerance', 'no comparison')}; {(rep.get('serve') or {}).get('writer', 'server did not start')})"
        record_e2e(
            client_row(name, v),
            _check(v),
            "pass" if res["agrees"] else "fail",
            said,
            **{
                k: res[k]
                for k in (
                    "per_native_id",
                    "last_layer_is_final_output",
                    "waited_on_lock",
                    "lock_left_behind",
                    "returned_key",
                )
                if k in res
            },
            native_ids=rep["native_ids"],
        )
        try:
            numerics_expected(client_row(name, v), res["agrees"], said)
        except (AssertionError, pytest.fail.Exception) as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def test_sync_writer_is_needed(record_e2e, expectations):
    """Needed: where the probe chooses the synchronous writer, vLLM's own connector, unchanged, fails the first
    request with one of its documented failures. (Sufficient: the agreement test above runs with it.)"""
    from harness.clients.server import ServerError, VllmServer
    from harness.clients.vllm_client import extract
    from harness.native import sync_writer
    from harness.subjects import models
    from harness.testing.recording import expected_broken

    key = client_row("tiny-llama")
    na = _no_export()
    if na:
        not_applicable(na)
    if expected_broken(expectations, key):
        not_applicable(f"not observable: the server path does not run on this vLLM (e2e[{key}] says why)")
    why = sync_writer.needed()
    check = "without harness.native.sync_writer: vLLM's own connector fails as documented"
    if why is None:
        record_e2e(key, check, "n/a", "not needed here: CUDA streams and pinned memory work in this process")
        not_applicable("the upstream connector's CUDA writer works here: no replacement to prove")
    model = models.build("tiny-llama")
    try:
        with VllmServer(model.path, [1, 3, 6], dtype="float32", sync_writer=False) as server:
            extract(server, [[(5 * j) % 200 + 4 for j in range(20)]], version=CLIENT)
    except ServerError as e:
        documented = re.search(sync_writer.FAILURES, str(e)) is not None
        record_e2e(key, check, "pass" if documented else "fail", f"probe: {why}; request: {e}"[:600])
        assert documented, f"vLLM's own connector failed, but not as documented: {e}"
        return
    record_e2e(key, check, "fail", f"probe said {why!r}, yet vLLM's own connector wrote the file")
    pytest.fail(f"the probe chose the synchronous writer ({why}), but vLLM's own connector worked: the probe is wrong")
