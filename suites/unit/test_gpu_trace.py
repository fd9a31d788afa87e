"""harness.gpu.trace's summary of a torch profiler trace (the trace's own format, written by hand here: the
summary is arithmetic over it, and a CPU-only machine records no CUDA events to summarise)."""

from harness.gpu import trace as gpu_trace


def _x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_kernels_copies_and_runtime_calls_are_summed_per_stream():
    trace = {
        "traceEvents": [
            _x("kernel", "gemm", 0, 100, stream=7),
            _x("kernel", "gemm", 50, 100, stream=7),  # overlaps the first: covered 150, summed 200
            _x("kernel", "rmsnorm", 400, 20, stream=7),  # after a 250 us gap: idle
            _x("kernel", "rmsnorm", 430, 10, stream=7),  # after a 10 us gap: launch spacing, not idle
            _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 100, 300, stream=9, bytes=3 << 20),
            _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 500, 100, stream=9, bytes=1 << 20),
            _x("cuda_runtime", "cudaMemcpyAsync", 90, 5),
            _x("cuda_runtime", "cudaMemcpyAsync", 490, 2000),
            _x("cuda_runtime", "cudaLaunchKernel", 0, 3),
            {"ph": "i", "name": "marker", "ts": 1},  # not a complete event: ignored
        ]
    }
    s = gpu_trace.summarise(trace)
    compute = s["streams"]["7"]
    assert compute["kernels"] == 4
    assert compute["kernel_ms"] == 0.23
    assert compute["covered_ms"] == 0.18
    assert compute["span_ms"] == 0.44
    assert compute["idle_ms"] == 0.25
    assert list(compute["top_kernels_ms"]) == ["gemm", "rmsnorm"]
    copies = s["streams"]["9"]["copies"]["Memcpy DtoH (Device -> Pinned)"]
    assert copies == {"count": 2, "ms": 0.4, "bytes": 4 << 20}
    assert s["streams"]["9"]["kernels"] == 0
    memcpy = s["runtime"]["cudaMemcpyAsync"]
    assert memcpy["count"] == 2 and memcpy["max_ms"] == 2.0
    assert list(s["runtime"]) == ["cudaMemcpyAsync", "cudaLaunchKernel"]  # longest total first


def test_an_empty_trace_summarises_to_nothing():
    assert gpu_trace.summarise({"traceEvents": []}) == {"streams": {}, "runtime": {}}
