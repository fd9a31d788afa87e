"""speculators >= 0.5's path (its client against `vllm serve` with the native export) against ours, on one model.

    python -m harness.clients.server_check --model tiny-llama --out DIR [--client 0.9.0 ...] [--dtype float32]
        [--attention-backend TRITON_ATTN] [--gpu-memory-utilization 0.3]

Ours first (speculators 0.3.0's generator through the shims, at speculators' ids k = native id - 1), closed,
then one server, the harness's own raw request first (`http_probe`: what the server answers, whatever a client
makes of it), then every release's client in turn, with the client's default layer ids ([2, n//2, n-3, n] in
vLLM's native convention, as speculators' launcher emits them with --include-last-layer), stopped: one engine at
a time. Per native id the
report gives the largest absolute difference and that difference relative to the largest value, and whether
the server's layer n is the final layer's output (for the DeepSeek family vLLM once returned one layer fewer).
Writes `<date>-clients-<model>-vllm<version>.json` and `.md` into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from harness.native.layer_ids import map_layer_ids
from harness.subjects.releases import CLIENT_FAILS, CLIENTS, SERVER_FAILS

#: Agreement bounds by dtype: float32 on one build and device differs only by batch composition (the server
#: receives the prompts one request at a time, ours in one batch); bf16 rounds each layer's output.
TOLERANCE = {"float32": ("abs", 1e-4), "bfloat16": ("rel", 5e-2)}


def client_default_ids(num_layers: int) -> list[int]:
    """speculators' launcher default ([2, n//2, n-3] plus n, the last layer's output, with --include-last-layer).
    The launcher refuses repeated ids, which that formula gives below 8 layers; there the ids a user would pass
    instead (--target-layer-ids, distinct, plus n)."""
    n = int(num_layers)
    ids = [2, n // 2, n - 3, n]
    if len(set(ids)) == len(ids) and min(ids) > 0:
        return ids
    return [1, n // 2, n - 1, n] if len({1, n // 2, n - 1, n}) == 4 else list(range(max(1, n - 3), n + 1))


def serve_extra(model, attention_backend: str | None, gpu_memory_utilization: float | None) -> tuple[str, ...]:
    """The vllm serve flags the model needs here (Kimi-K2.5: the language model only), as our generator runs it."""
    extra = ["--max-num-seqs", "32"]
    if (model.run_options or {}).get("language_model_only"):
        extra.append("--language-model-only")
    if attention_backend:
        extra += ["--attention-backend", attention_backend]
    if gpu_memory_utilization:
        extra += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    return tuple(extra)


def http_probe(server, prompt: list[int]) -> dict:
    """The server's answer to the request every release makes (`/v1/completions`, the token ids, max_tokens=1,
    return_token_ids), read raw: the echoed prompt ids and the kv_transfer_params keys. The file it names is
    removed (with its lock, once released) so the clients' runs start from an empty store."""
    import urllib.request

    body = json.dumps(
        {"model": server.model, "prompt": [int(t) for t in prompt], "max_tokens": 1, "return_token_ids": True}
    ).encode()
    req = urllib.request.Request(server.base_url + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            got = json.loads(r.read())
    except Exception as e:  # noqa: BLE001 - what the server answered is the finding
        server.check_alive("the raw /v1/completions request")
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    params = got.get("kv_transfer_params") or {}
    echoed = (got.get("choices") or [{}])[0].get("prompt_token_ids")
    path = params.get("hidden_states_path") or params.get("handle")
    out = {
        "ok": True,
        "prompt_token_ids_echoed": echoed == [int(t) for t in prompt],
        "kv_transfer_params_keys": sorted(params),
        "file_key": next((k for k in ("hidden_states_path", "handle") if params.get(k)), None),
    }
    if path:
        out["file"] = _file_holds(path, prompt, len(set(server.native_ids)))
    return out


def _file_holds(path: str, prompt: list[int], layers: int) -> dict:
    """The file read as the lock protocol says (waiting on the writer's lock where it made one), then removed:
    `hidden_states` [tokens, layers, hidden] and `token_ids` == the prompt, nothing else."""
    from harness.native.files import layout_of, read_export

    had_lock = os.path.exists(path + ".lock")
    try:
        data, waited = read_export(path)
    except Exception as e:  # noqa: BLE001 - an unreadable file is the finding
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}", "lock": had_lock}
    layout = layout_of(data)
    holds = (
        set(data) == {"hidden_states", "token_ids"}
        and data["hidden_states"].dim() == 3
        and tuple(data["hidden_states"].shape[:2]) == (len(prompt), layers)
        and data["token_ids"].tolist() == [int(t) for t in prompt]
    )
    return {
        "ok": True,
        "layout": layout,
        "holds": bool(holds),
        "lock": "a .lock the reader waited on, then removed" if waited else "no lock file: complete on return",
    }


def _compare(theirs, ours, native: list[int], ours_ids: list[int], prompts, dtype: str, n: int) -> dict:
    """One client's files against ours, per native id (the bound by dtype, TOLERANCE)."""
    kind, tol = TOLERANCE[dtype]
    res = _how_it_returned(theirs, prompts)
    res["per_native_id"] = per_id = _per_native_id(theirs, ours, native, ours_ids)
    measure = "max_abs_diff" if kind == "abs" else "rel_diff"
    worst = max(v[measure] for v in per_id.values())
    res["tolerance"] = f"{measure} <= {tol:g}"
    res["agrees"] = bool(worst <= tol and res["token_ids_echoed"])
    if str(n) in per_id:
        res["last_layer_is_final_output"] = per_id[str(n)][measure] <= tol
    res["verdict"] = (
        "agrees with ours at every id compared"
        if res["agrees"]
        else f"disagrees: worst {measure} {worst:.3g} > {tol:g} at native ids "
        f"{[j for j, v in per_id.items() if v[measure] > tol]}"
    )
    return res


def _returned_key(t) -> str:
    if t.kv_transfer_params is None:
        return "not returned by this release"
    return next((k for k in ("hidden_states_path", "handle") if k in t.kv_transfer_params), "?")


def _how_it_returned(theirs, prompts) -> dict:
    """What the client's results say besides the states: token ids echoed, lock files, the key, layout, reader."""
    return {
        "token_ids_echoed": all(t.token_ids == [int(x) for x in p] for t, p in zip(theirs, prompts, strict=True)),
        "waited_on_lock": sorted({t.waited_on_lock for t in theirs}),
        "lock_left_behind": sorted({t.lock_left for t in theirs}),
        "returned_key": sorted({_returned_key(t) for t in theirs}),
        "layout": theirs[0].layout if theirs else None,
        "reader": sorted({t.reader for t in theirs}),
    }


def _per_native_id(theirs, ours, native: list[int], ours_ids: list[int]) -> dict:
    """Per native id: speculators' id for it, the largest absolute difference over the prompts, and it relative
    to the largest magnitude of ours."""
    per_id = {}
    ours = [{"hidden_states": o["hidden_states"][: len(native)]} for o in ours]
    for i, j in enumerate(native):
        diff = max(
            float((t.hidden_states[i].float() - o["hidden_states"][i].float()).abs().max())
            for t, o in zip(theirs, ours, strict=True)
        )
        scale = max(float(o["hidden_states"][i].float().abs().max()) for o in ours)
        per_id[str(j)] = {
            "speculators_id": ours_ids[i],
            "max_abs_diff": diff,
            "rel_diff": diff / scale if scale else diff,
        }
    return per_id


def run(
    name: str,
    *,
    clients: tuple[str, ...] = CLIENTS,
    dtype: str = "float32",
    attention_backend: str | None = None,
    gpu_memory_utilization: float | None = None,
    prompts: list[list[int]] | None = None,
    sync_writer: bool | None = None,
) -> dict:
    """Ours, then one server that every release in `clients` is driven against in turn (each sends all prompts).
    `sync_writer`: as VllmServer's (None: chosen by probing). The report's `serve` says how the server started
    (or why not); `clients[version]` each release's result; the top level the last-layer finding."""
    from harness.clients.declared import transformers_finding
    from harness.clients.server import ServerError, VllmServer
    from harness.clients.vllm_client import extract
    from harness.contracts import mla
    from harness.runtime.generator import HarnessGenerator, options_for
    from harness.subjects import models
    from harness.subjects.prompts import random_prompts

    model = models.build(name)
    n = model.num_layers
    native = client_default_ids(n)
    ours_ids = map_layer_ids(native, n, to="speculators")
    prompts = prompts or random_prompts(6, 17, 96, model.vocab_size, seed=21)
    rep: dict[str, Any] = {
        "model": name,
        "clients_asked": list(clients),
        "native_ids": native,
        "speculators_ids": ours_ids,
        "dtype": dtype,
        "attention_backend": attention_backend,
        "prompts": len(prompts),
        "tokens": sum(len(p) for p in prompts),
        "clients": {},
    }
    mla.prepare(model, attention_backend)
    t0 = time.perf_counter()
    kw: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}
    overrides = {"dtype": dtype, **({"attention_backend": attention_backend} if attention_backend else {})}
    with HarnessGenerator(
        model.path, ours_ids, max_model_len=512, options=options_for(model, **overrides), **kw
    ) as gen:
        ours = gen.generate(prompts)
    rep["ours_s"] = round(time.perf_counter() - t0, 1)

    def serve(ids: list[int]) -> dict:
        """{version: [ServerExport] or ServerError}; raises ServerError where the server itself fails."""
        t0 = time.perf_counter()
        got: dict[str, Any] = {}  # a release's exports, or the ServerError it met
        with VllmServer(
            model.path,
            ids,
            dtype=dtype,
            max_model_len=512,
            sync_writer=sync_writer,
            extra=serve_extra(model, attention_backend, gpu_memory_utilization),
        ) as server:
            rep["serve"] = {
                "started": True,
                "start_s": round(time.perf_counter() - t0, 1),
                "writer": (
                    f"harness.native.sync_writer's connector (upstream writer here: {server.sync_writer_why})"
                    if server.sync_writer
                    else "vLLM's own connector"
                ),
                "args": [a.replace(str(server.storage), "<storage>") for a in server.args[3:] if not a.startswith("/")],
            }
            rep["http"] = http_probe(server, prompts[0])
            for version in clients:
                try:
                    got[version] = extract(server, prompts, version=version)
                except ServerError as e:
                    got[version] = e
                    if not server.healthy():  # the server died under this client: the others cannot run
                        raise
        return got

    try:
        theirs = serve(native)
    except ServerError as e:
        # Retry without id n (the last layer's output), the one id some model classes never capture: if that
        # works, the failure was id n; the comparison then covers the other ids.
        rep["failure"] = str(e)
        native, ours_ids = native[:-1], ours_ids[:-1]
        try:
            theirs = serve(native)
        except ServerError as e2:
            rep.setdefault("serve", {"started": False, "error": str(e)})
            rep["without_last_layer"] = str(e2)
            for version in clients:
                rep["clients"][version] = {"agrees": False, "verdict": f"{SERVER_FAILS}: {e}"}
            return rep
        rep["last_layer_is_final_output"] = False
        rep["without_last_layer"] = f"works without native id {n}: compared at {native}"
    for version in clients:
        got = theirs[version]
        if isinstance(got, ServerError):
            rep["clients"][version] = {"agrees": False, "verdict": f"{CLIENT_FAILS}: {got}", "error": str(got)}
            continue
        res = _compare(got, ours, native, ours_ids, prompts, dtype, n)
        res["transformers"] = transformers_finding(version)
        if "failure" in rep:
            # The launcher asks for id n by default (--include-last-layer): a release whose default request kills
            # the engine does not work here, however well the other ids agree.
            said = rep["failure"].split("the server's log says: ")[-1]
            res["agrees_without_last_layer"], res["agrees"] = res["agrees"], False
            res["verdict"] = (
                f"native id {n} (the last layer's output, in the launcher's default ids) is not exported: "
                f"{said}; without it, {res['verdict']}"
            )
        elif res.get("last_layer_is_final_output") is False:
            res["verdict"] += f"; native id {n} differs from our id {n - 1} (the last layer's output) beyond the bound"
        rep["clients"][version] = res
    finals = {r["last_layer_is_final_output"] for r in rep["clients"].values() if "last_layer_is_final_output" in r}
    if "last_layer_is_final_output" not in rep and finals:
        rep["last_layer_is_final_output"] = finals == {True}
    return rep


def markdown(rep: dict) -> str:
    serve = rep.get("serve", {})
    lines = [
        f"# speculators' clients via `vllm serve` vs ours: {rep['model']} ({rep['date']})",
        "",
        f"vLLM {rep.get('vllm')}, {rep['dtype']}, attention {rep['attention_backend'] or 'default'}; "
        f"{rep['prompts']} prompts, {rep['tokens']} tokens; native ids {rep['native_ids']} = speculators' "
        f"{rep['speculators_ids']}. Server: "
        + (
            f"started in {serve.get('start_s')} s, {serve.get('writer')}"
            if serve.get("started")
            else f"did not start: {serve.get('error')}"
        ),
        "",
    ]
    if rep.get("without_last_layer"):
        lines += [f"Last layer (native id {max(rep['native_ids'])}): {rep['without_last_layer']}", ""]
    for version, c in rep["clients"].items():
        lines += [
            f"## speculators {version}",
            "",
            f"**{c['verdict']}**"
            + (
                f" (bound: {c['tolerance']}); prompt ids echoed: {c['token_ids_echoed']}; key returned: "
                f"{c['returned_key']}; waited on a lock: {c['waited_on_lock']}; lock left behind: {c['lock_left_behind']}"
                if "tolerance" in c
                else ""
            ),
            "",
        ]
        if c.get("reader"):
            t = c.get("transformers", {})
            lines += [
                f"Read by: {', '.join(c['reader'])}. transformers: declared {t.get('declared')}, this run had "
                f"{t.get('installed')} ({'inside' if t.get('inside') else 'outside'} the range; imported by the "
                f"client path: {'yes' if t.get('imported_by_client_path') else 'no'})",
                "",
            ]
        if c.get("per_native_id"):
            lines += ["| native id | speculators id | max abs diff | relative |", "|---|---|---|---|"]
            lines += [
                f"| {j} | {v['speculators_id']} | {v['max_abs_diff']:.3g} | {v['rel_diff']:.3g} |"
                for j, v in c["per_native_id"].items()
            ]
            lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.clients.server_check")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--client", action="append", help=f"speculators release(s) (default: all of {', '.join(CLIENTS)})")
    ap.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    ap.add_argument("--attention-backend")
    ap.add_argument("--gpu-memory-utilization", type=float)
    args = ap.parse_args(argv)
    from harness.installed import versions
    from harness.support.report_files import write_atomic
    from harness.support.volatile import stable

    rep = run(
        args.model,
        clients=tuple(args.client or CLIENTS),
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    rep["date"] = time.strftime("%Y-%m-%d")
    snap = versions.snapshot()
    rep.update(vllm=snap.get("vllm"), torch=snap.get("torch"), device_type=snap.get("device_type"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{rep['date']}-clients-{args.model}-vllm{rep['vllm']}"
    rep = stable(rep)
    write_atomic(out / f"{stem}.json", json.dumps(rep, indent=2) + "\n")
    write_atomic(out / f"{stem}.md", markdown(rep))
    print(markdown(rep))
    return 0 if all(c["agrees"] for c in rep["clients"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
