"""Where a worker's GPU time went during one call: a torch profiler trace, summarised in the worker.

Phase timers in the caller see how long `execute_model` took, not why. When the streamed hand-off made the
forward ~4% slower at the Kimi-K2.5 width (the copies run on a side stream, beside the next step's kernels),
the question was whether the kernels themselves ran slower (the device shared with the copies), the device
sat idle waiting for the host (a copy that blocks the worker's thread), or the host work per step grew.
The trace answers that per stream: kernel time and the span it covers, idle gaps, each kind of copy with its
bytes and whether the host side was pinned (the copy's name says so), and the CUDA runtime calls the host
made (a long `cudaMemcpyAsync` is a copy that blocked).

Used by `benchmarks/gpu_extraction_profile.py --gpu-profile` and `benchmarks/gpu_batch_shapes.py --trace` (`traced`) through the worker extension's `_harness_call`
(`start` before one `generate`, `stop` after; only the summary crosses back, the trace stays in a temporary file
that is removed).
"""

from __future__ import annotations

import json
import os
import tempfile

#: Idle stretches on a stream shorter than this are launch spacing, not waiting.
GAP_US = 50.0
TOP_KERNELS = 12


def start(worker) -> None:
    """Begin recording CPU and CUDA activity in this worker process."""
    import torch

    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    )
    prof.__enter__()
    worker._harness_trace = prof


def stop(worker) -> dict:
    """Stop recording and return the summary (see `summarise`)."""
    prof = worker.__dict__.pop("_harness_trace")
    prof.__exit__(None, None, None)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return summarise(json.load(f))
    finally:
        os.unlink(path)


def traced(call, rpc) -> dict:
    """One call of `call` with every worker `rpc` reaches recording (`rpc(fn)` runs `fn(worker)` in each: the
    harness's `_harness_call`, or plain vLLM's `collective_rpc`); the first worker's summary, with the call's wall
    time as `call_s`."""
    import time

    rpc(start)
    t = time.perf_counter()
    call()
    wall = time.perf_counter() - t
    summary = rpc(stop)[0]
    summary["call_s"] = wall
    return summary


def _union(intervals: list) -> tuple[float, float]:
    """Busy time of possibly overlapping (start, end) intervals, and the idle time between them (gaps > GAP_US)."""
    busy = idle = 0.0
    end = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None and s - end > GAP_US:
                idle += s - end
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy, idle


def summarise(trace: dict) -> dict:
    """Per stream: kernels (count, summed and covered time, span, idle gaps, the longest kernels by name), copies
    by kind (count, time, bytes); the host's CUDA runtime calls by name (count, total, longest). Times in ms."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    streams: dict = {}
    runtime: dict = {}
    for e in events:
        cat, dur, ts = e.get("cat", ""), float(e["dur"]), float(e["ts"])
        args = e.get("args", {})
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            s = streams.setdefault(str(args.get("stream", "?")), {"kernels": [], "names": {}, "copies": {}})
        if cat == "kernel":
            s["kernels"].append((ts, ts + dur))
            s["names"][e["name"]] = s["names"].get(e["name"], 0.0) + dur
        elif cat in ("gpu_memcpy", "gpu_memset"):
            c = s["copies"].setdefault(e["name"], {"count": 0, "ms": 0.0, "bytes": 0})
            c["count"] += 1
            c["ms"] += dur / 1e3
            c["bytes"] += int(args.get("bytes", 0) or 0)
        elif cat in ("cuda_runtime", "cuda_driver"):
            r = runtime.setdefault(e["name"], {"count": 0, "ms": 0.0, "max_ms": 0.0})
            r["count"] += 1
            r["ms"] += dur / 1e3
            r["max_ms"] = max(r["max_ms"], dur / 1e3)
    out: dict = {"streams": {}, "runtime": dict(sorted(runtime.items(), key=lambda kv: -kv[1]["ms"])[:15])}
    for sid, s in streams.items():
        k = s["kernels"]
        busy, idle = _union(k)
        top = sorted(s["names"].items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
        out["streams"][sid] = {
            "kernels": len(k),
            "kernel_ms": sum(e - b for b, e in k) / 1e3,
            "covered_ms": busy / 1e3,
            "span_ms": (max(e for _, e in k) - min(b for b, _ in k)) / 1e3 if k else 0.0,
            "idle_ms": idle / 1e3,
            "top_kernels_ms": {name[:90]: round(t / 1e3, 3) for name, t in top},
            "copies": s["copies"],
        }
    return out
