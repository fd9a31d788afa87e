"""speculators >= 0.5's own path, end to end on this vLLM: speculators 0.9.0's client (`vllm_client`, loaded from
its wheel) against a real `vllm serve` with the native export, compared with our extraction at the mapped ids.

Each result is an e2e row `e2e[client0.9.0:<model>]`: `pass` where the client's files agree with ours within
the native bound; where this vLLM cannot serve the export at all the row is expected `broken` (the reason in the
expectations file; strict: if it starts working, the run fails until the file says so); without a native export
the test is a declared n/a. On a CPU build the connector's CUDA-only writer is replaced by
harness.native.sync_writer (chosen by probing); `test_sync_writer_is_needed` proves the replacement needed
(vLLM's own connector fails as documented) and the agreement test proves it sufficient.
"""

from __future__ import annotations

import re

import pytest

from harness.native import availability
from harness.native.client_axis import CLIENT, CLIENT_MODELS, client_row
from harness.testing.recording import not_applicable

CHECK = f"speculators {CLIENT} via vllm serve agrees with ours at the mapped ids"


def _native_or_skip(record_e2e, key: str) -> None:
    ok, why = availability()
    if not ok:
        record_e2e(key, CHECK, "n/a", f"no native hidden-state export in this vLLM: {why}")
        not_applicable(f"no native hidden-state export in this vLLM ({why})")


@pytest.mark.parametrize("name", CLIENT_MODELS)
def test_client_agrees_with_ours(name, record_e2e, numerics_expected):
    from harness.native import server_check

    key = client_row(name)
    _native_or_skip(record_e2e, key)
    rep = server_check.run(name, version=CLIENT)
    said = f"{rep['verdict']} ({rep.get('tolerance', 'no comparison')}; {rep.get('sync_writer', 'server did not start')})"
    record_e2e(key, CHECK, "pass" if rep["agrees"] else "fail", said,
               **{k: rep[k] for k in ("native_ids", "per_native_id", "last_layer_is_final_output") if k in rep})
    numerics_expected(key, rep["agrees"], said)


def test_sync_writer_is_needed(record_e2e, expectations):
    """Needed: where the probe chooses the synchronous writer, vLLM's own connector, unchanged, fails the first
    request with one of its documented failures. (Sufficient: the agreement test above runs with it.)"""
    from harness.native import sync_writer
    from harness.native.client import extract
    from harness.native.server import ServerError, VllmServer
    from harness import models

    from harness.testing.recording import expected_broken

    key = client_row("tiny-llama")
    _native_or_skip(record_e2e, key)
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
