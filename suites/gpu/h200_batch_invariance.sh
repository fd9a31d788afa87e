#!/usr/bin/env bash
# benchmarks/gpu_batch_invariance.py on the GPU machine: a prompt alone against the same prompt in random batches,
# with vLLM's batch-invariant mode and without. After call 1 of a bundle (see h200_env.sh); carry the bundle's
# other parts and .whl. MODES (default on,off; also on-norm, and each with -eager), CALLS (60), SHAPE (llama1b4),
# DIAGNOSE (0: calls per mode whose alone-vs-batch difference is traced to a module); the result in $OUT/gpu/.
set -uo pipefail
. suites/gpu/h200_env.sh
name="$(date +%F)-batch-invariance-${SHAPE:-llama1b4}-$VLLM_TAG"
timeout "${BI_TIMEOUT:-480}" "$PY" benchmarks/gpu_batch_invariance.py --shape "${SHAPE:-llama1b4}" \
  --calls "${CALLS:-60}" --modes "${MODES:-on,off}" --diagnose "${DIAGNOSE:-0}" --out "$OUT/gpu/$name.json" > "$OUT/$name.log" 2>&1
rc=$?
grep -E "^(on|off)[-a-z]* |Error|error" "$OUT/$name.log" | grep -v '^(' | cut -c1-400 | tail -20
rm -rf "$HARNESS_CACHE_DIR"/bench-*
exit $rc
