#!/usr/bin/env bash
# The GPU tier on Kimi-K2.5 as released (harness.gpu.kimi_int4: real width, 384 INT4 routed experts, top-8), cut to
# LAYERS layers (default 3: one dense, two MoE), with no weights on disk (harness.gpu.seeded_loader), at TP
# (default 1). After call 1 of a bundle (see h200_env.sh); carry the bundle's other parts and .whl.
#   BUNDLE=build/gpu-bundle/vllm-0.25.0 bash suites/gpu/h200_kimi_int4.sh              # one H200: the slice
#   LAYERS=61 TP=8 BUNDLE=... bash suites/gpu/h200_kimi_int4.sh                         # eight GPUs: full depth
# BI_PROBE=1 then starts the same model once more with vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1) and
# keeps what vLLM says (kimi-int4-batch-invariant.log): whether that mode can run these INT4 experts at all.
set -uo pipefail
. suites/gpu/h200_env.sh
LAYERS="${LAYERS:-3}" TP="${TP:-1}" RUNS="${RUNS:-1}"
"$PY" -m harness.gpu.seeded_loader --entry-point-into "$SITE" > /dev/null || exit 6
MODEL=$("$PY" -m harness.gpu.kimi_int4 --layers "$LAYERS") || exit 6
rc=0
for run in $(seq "$RUNS"); do  # RUNS=2: the same tier twice on this machine (each its own report and drift check)
  timeout "${KIMI_TIMEOUT:-540}" "$PY" -m harness gpu-nightly --model-path "$MODEL" --tp "$TP" --dtype bfloat16 \
    --attention-backend TRITON_MLA --gpu-memory-utilization "${GPU_UTIL:-0.4}" --report-dir "$OUT/gpu" \
    --env "gpu-$VLLM_TAG-kimi-int4-${LAYERS}l" -- -q -rA --harness-report-dir "$OUT/env" > "$OUT/kimi-int4-$run.log" 2>&1 \
    || rc=$((rc ? rc : $?))
  grep -E "MoE|Marlin|marlin|passed|failed|Error|error" "$OUT/kimi-int4-$run.log" | grep -v '^(' | cut -c1-300 | tail -25
done
if [ -n "${BI_PROBE:-}" ]; then
  VLLM_BATCH_INVARIANT=1 timeout "${BI_TIMEOUT:-240}" "$PY" -m harness gpu-nightly --model-path "$MODEL" --tp "$TP" \
    --dtype bfloat16 --attention-backend TRITON_MLA --gpu-memory-utilization "${GPU_UTIL:-0.4}" \
    --report-dir "$OUT/batch-invariant" --env "gpu-$VLLM_TAG-kimi-int4-bi" -- -q -rA -x \
    -k test_batch_shapes_dtype_finite > "$OUT/kimi-int4-batch-invariant.log" 2>&1
  echo "batch-invariant start: exit $?"
  grep -E "WNA16|MoE backend|batch.invarian|NotImplementedError|passed|failed" "$OUT/kimi-int4-batch-invariant.log" \
    | grep -v '^(' | cut -c1-300 | tail -8
fi
exit $rc
