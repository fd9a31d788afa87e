#!/usr/bin/env bash
# speculators >= 0.5's path on the H200: each release's own client (vllm_client.py from the speculators 0.5.0, 0.6.0,
# 0.8.0 and 0.9.0 wheels) against one `vllm serve` with the native export per model, compared with ours on the same
# prompts (harness.clients.server_check). After call 1 (see h200_env.sh); carry .gpu-part2, .whl, .srv-wheels
# (h200_server_env.sh) and .client-wheels (the speculators wheels: not installed, their client modules are loaded by
# path). Reports land in $OUT/gpu, the logs beside them.
set -uo pipefail
. suites/gpu/h200_env.sh
. suites/gpu/h200_server_env.sh
export HARNESS_SPECULATORS_WHEELS="$PWD/.client-wheels" HARNESS_SERVER_LOG_DIR="$OUT/gpu"
rc=0
# Both in bf16 (float32 on CUDA runs its matmuls in TF32: two engines differ beyond the float32 bound): tiny Llama on
# TRITON_ATTN, tiny Kimi-K2.5 on TRITON_MLA (real MLA). `h200_client.sh [MODEL...]` runs only those.
for model in "${@:-tiny-llama tiny-kimi-k25}"; do
  for m in $model; do
    case $m in tiny-llama) backend=TRITON_ATTN; limit=280 ;; *) backend=TRITON_MLA; limit=380 ;; esac
    timeout $limit "$PY" -m harness.clients.server_check --model "$m" --dtype bfloat16 --attention-backend $backend \
      --gpu-memory-utilization 0.3 --out "$OUT/gpu" > "$OUT/gpu/client-$m.log" 2>&1 || rc=$((rc ? rc : $?))
    grep -vE "^\(|INFO|WARNING|it/s\]|Loading safetensors" "$OUT/gpu/client-$m.log" | tail -20
  done
done
exit $rc
