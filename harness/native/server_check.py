"""speculators >= 0.5's path (its client against `vllm serve` with the native export) against ours, on one model.

    python -m harness.native.server_check --model tiny-llama --out DIR [--client 0.9.0] [--dtype float32]
        [--attention-backend TRITON_ATTN] [--gpu-memory-utilization 0.3]

Ours first (speculators 0.3.0's generator through the shims, at speculators' ids k = native id - 1), closed,
then the server with the client's default layer ids ([2, n//2, n-3, n] in vLLM's native convention, as
speculators' launcher emits them with --include-last-layer), stopped: one engine at a time. Per native id the
report gives the largest absolute difference and that difference relative to the largest value, and whether
the server's layer n is the final layer's output (for the DeepSeek family vLLM once returned one layer fewer).
Writes `<date>-client<version>-<model>.json` and `.md` into --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.native.layer_ids import map_layer_ids

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


def run(name: str, *, version: str = "0.9.0", dtype: str = "float32", attention_backend: str | None = None,
        gpu_memory_utilization: float | None = None, prompts: list[list[int]] | None = None,
        sync_writer: bool | None = None) -> dict:
    """`sync_writer`: as VllmServer's (None: chosen by probing)."""
    from harness import models
    from harness.contracts import mla
    from harness.native.client import extract
    from harness.native.server import ServerError, VllmServer
    from harness.prompts import random_prompts
    from harness.runtime.generator import HarnessGenerator, options_for

    model = models.build(name)
    n = model.num_layers
    native = client_default_ids(n)
    ours_ids = map_layer_ids(native, n, to="speculators")
    prompts = prompts or random_prompts(6, 17, 96, model.vocab_size, seed=21)
    rep = {"model": name, "client": f"speculators {version}", "native_ids": native, "speculators_ids": ours_ids,
           "dtype": dtype, "attention_backend": attention_backend, "prompts": len(prompts),
           "tokens": sum(len(p) for p in prompts)}
    mla.prepare(model, attention_backend)
    t0 = time.perf_counter()
    kw = {"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}
    overrides = {"dtype": dtype, **({"attention_backend": attention_backend} if attention_backend else {})}
    with HarnessGenerator(model.path, ours_ids, max_model_len=512, options=options_for(model, **overrides), **kw) as gen:
        ours = gen.generate(prompts)
    rep["ours_s"] = round(time.perf_counter() - t0, 1)
    def serve(ids: list[int]):
        t0 = time.perf_counter()
        with VllmServer(model.path, ids, dtype=dtype, max_model_len=512, sync_writer=sync_writer,
                        extra=serve_extra(model, attention_backend, gpu_memory_utilization)) as server:
            rep["server_start_s"] = round(time.perf_counter() - t0, 1)
            rep["sync_writer"] = (f"harness.native.sync_writer's connector (upstream writer here: {server.sync_writer_why})"
                                  if server.sync_writer else "vLLM's own connector")
            rep["serve_args"] = [a.replace(str(server.storage), "<storage>") for a in server.args[3:]
                                 if not a.startswith("/")]
            return extract(server, prompts, version=version)

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
            rep["verdict"], rep["agrees"] = f"the server path fails: {e}", False
            rep["without_last_layer"] = str(e2)
            return rep
        rep["last_layer_is_final_output"] = False
        rep["without_last_layer"] = f"works without native id {n}: compared at {native}"
    rep["token_ids_echoed"] = all(t.token_ids == [int(x) for x in p] for t, p in zip(theirs, prompts))
    rep["waited_on_lock"] = sorted({t.waited_on_lock for t in theirs})
    kind, tol = TOLERANCE[dtype]
    per_id = {}
    ours = [{"hidden_states": o["hidden_states"][:len(native)]} for o in ours]
    for i, j in enumerate(native):
        diff = max(float((t.hidden_states[i].float() - o["hidden_states"][i].float()).abs().max())
                   for t, o in zip(theirs, ours))
        scale = max(float(o["hidden_states"][i].float().abs().max()) for o in ours)
        per_id[str(j)] = {"speculators_id": ours_ids[i], "max_abs_diff": diff, "rel_diff": diff / scale if scale else diff}
    rep["per_native_id"] = per_id
    measure = "max_abs_diff" if kind == "abs" else "rel_diff"
    worst = max(v[measure] for v in per_id.values())
    rep["tolerance"] = f"{measure} <= {tol:g}"
    rep["agrees"] = bool(worst <= tol and rep["token_ids_echoed"])
    if str(n) in per_id:
        rep["last_layer_is_final_output"] = per_id[str(n)][measure] <= tol
    rep["verdict"] = ("agrees with ours at every id compared" if rep["agrees"] else
                      f"disagrees: worst {measure} {worst:.3g} > {tol:g} at native ids "
                      f"{[j for j, v in per_id.items() if v[measure] > tol]}")
    if "failure" in rep:
        said = rep["failure"].split("the server's log says: ")[-1]
        rep["verdict"] += f"; native id {n} (the last layer's output) is not exported: {said}"
    elif rep.get("last_layer_is_final_output") is False:
        rep["verdict"] += f"; native id {n} differs from our id {n - 1} (the last layer's output) beyond the bound"
    return rep


def markdown(rep: dict) -> str:
    lines = [f"# {rep['client']} via `vllm serve` vs ours: {rep['model']} ({rep['date']})", "",
             f"vLLM {rep.get('vllm')}, {rep['dtype']}, attention {rep['attention_backend'] or 'default'}; "
             f"{rep['prompts']} prompts, {rep['tokens']} tokens; native ids {rep['native_ids']} = speculators' "
             f"{rep['speculators_ids']}.", "", f"**{rep['verdict']}** (bound: {rep['tolerance']}); prompt ids echoed: "
             f"{rep['token_ids_echoed']}; lock files: {rep['waited_on_lock']}; server start {rep['server_start_s']} s.",
             "", "| native id | speculators id | max abs diff | relative |", "|---|---|---|---|"]
    for j, v in rep.get("per_native_id", {}).items():
        lines.append(f"| {j} | {v['speculators_id']} | {v['max_abs_diff']:.3g} | {v['rel_diff']:.3g} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.native.server_check")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--client", default="0.9.0")
    ap.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    ap.add_argument("--attention-backend")
    ap.add_argument("--gpu-memory-utilization", type=float)
    args = ap.parse_args(argv)
    from harness import versions
    from harness.reporting.report import write_atomic

    rep = run(args.model, version=args.client, dtype=args.dtype, attention_backend=args.attention_backend,
              gpu_memory_utilization=args.gpu_memory_utilization)
    rep["date"] = time.strftime("%Y-%m-%d")
    snap = versions.snapshot()
    rep.update(vllm=snap.get("vllm"), torch=snap.get("torch"), device_type=snap.get("device_type"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{rep['date']}-client{args.client}-{args.model}"
    write_atomic(out / f"{stem}.json", json.dumps(rep, indent=2) + "\n")
    write_atomic(out / f"{stem}.md", markdown(rep))
    print(markdown(rep))
    return 0 if rep["agrees"] else 1


if __name__ == "__main__":
    sys.exit(main())
