"""vLLM's own hidden-states export timed against plain prefill on the same engine (gpu_extraction_profile.py
`--native`, `--native-only`).

`--native` then closes ours and times vLLM's own export (`extract_hidden_states` + `ExampleHiddenStatesConnector`,
harness.native.engine.NativeExporter, the same layers in vLLM's convention, bf16) against the same plain engine, in
the same interleaved pairs: a call is `LLM.generate` until every file is written (each request's file complete,
its `.lock` released where the writer makes one), the files removed after; they go to /dev/shm where it has room
for a call's states (the write is then memory bandwidth, as ours is), else to the temp folder (`native.storage`).
`--native-only` starts no extraction engine (plain and native only: at the Kimi width three engine start-ups and
the checkpoint build do not fit one call); `--layer-ids` then names the layers (speculators' convention), e.g. four
that leave out the last one, whose id the DeepseekV3 family does not export on vLLM 0.20.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.contracts.base import strip_machine_paths  # noqa: E402 - after the path set-up
from harness.gpu import flops as model_flops  # noqa: E402


def start_native(model, layer_ids: list[int], max_model_len: int, share: float, backend: str | None, storage):
    from harness.native.engine import NativeExporter

    return NativeExporter(
        model,
        layer_ids,
        max_model_len=max_model_len,
        attention_backend=backend,
        gpu_memory_utilization=share,
        storage_dir=storage,
        dtype="bfloat16",
    )


def native_call(exporter, prompts):
    """One native-export call as a trainer would wait for it: generate, then every file complete (its lock, where
    the writer makes one, released), then the files removed (the next call starts from an empty store)."""
    from harness.native.engine import NativeExportError
    from harness.native.engine_log import root_cause
    from harness.native.files import writer_released

    def call():
        try:
            outs = exporter.generate(prompts)
        except Exception as exc:  # the engine's own words are in its log, which close() removes
            raise NativeExportError("extract", exc, root_cause(exporter._log()), "") from exc
        for out in outs:
            path = (getattr(out, "kv_transfer_params", None) or {}).get("hidden_states_path")
            if not path:
                raise RuntimeError("the native export returned no hidden_states_path")
            with writer_released(path):
                pass
            os.remove(path)

    return call


def shm_free() -> int:
    return shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0


def speculators_default_ids(num_layers: int) -> list[int]:
    """speculators 0.3.0's own choice when no layer ids are given (its generator's __init__)."""
    return [2, num_layers // 2, num_layers - 3, num_layers - 1]


def measure_native(model, plain, prompts, layer_ids, captured_bytes: int, args, tokens: int, flops: float) -> dict:
    """vLLM's native export against `plain` in interleaved pairs (the engine started here and always closed)."""
    from harness.scenarios import bench

    storage = Path("/dev/shm" if shm_free() > 3 * captured_bytes else tempfile.gettempdir())
    storage = Path(tempfile.mkdtemp(prefix="native-bench-", dir=storage))
    t0 = time.perf_counter()
    exporter = start_native(model, layer_ids, args.max_model_len, args.share, args.attention_backend, storage)
    try:
        start_s = time.perf_counter() - t0
        try:
            r = bench.paired(plain, native_call(exporter, prompts), pairs=args.pairs)
        except Exception as exc:  # noqa: BLE001 - the path not running at this shape is the finding
            print(f"[native export] does not run: {exc}")
            return {
                "runs": False,
                "error": strip_machine_paths(str(exc))[:1500],
                "native_ids": exporter.native_ids,
                "native_start_s": start_s,
            }
        r["native_start_s"] = start_s
        r["plain_tokens_per_s"] = tokens / r["plain_s"]["median"]
        r["native_tokens_per_s"] = tokens / r["extract_s"]["median"]
        r["plain_mfu"] = flops / r["plain_s"]["median"] / model_flops.PEAK_FLOPS
        r["native_mfu"] = flops / r["extract_s"]["median"] / model_flops.PEAK_FLOPS
        r["verdict"] = bench.verdict(r["ratio"])
        r["storage"] = "/dev/shm (tmpfs)" if str(storage).startswith("/dev/shm") else "temp folder (disk)"
        r["native_ids"] = exporter.native_ids
        print(
            f"[native export] {r['verdict']}; plain {r['plain_tokens_per_s']:.0f} tok/s, native "
            f"{r['native_tokens_per_s']:.0f} tok/s (MFU {r['native_mfu']:.1%}), files on {r['storage']}"
        )
        return r
    finally:
        exporter.close()
        shutil.rmtree(storage, ignore_errors=True)
