"""Workloads run on a started generator and measured: paired throughput against plain vLLM prefill (`bench`) and
the soak of calls that grow, shrink, straddle steps and repeat (`soak`)."""
