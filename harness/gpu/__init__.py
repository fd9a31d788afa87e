"""What only the GPU tier uses: its configuration and drift check (`tier`), the model FLOPs behind its MFU
(`flops`), and the worker-side profiler summary of the GPU benchmark (`trace`).

CPU runs never import these; suites/gpu/ and `python -m harness gpu-nightly` do (see docs/gpu.md)."""
