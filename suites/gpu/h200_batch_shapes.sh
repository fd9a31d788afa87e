#!/usr/bin/env bash
# benchmarks/gpu_batch_shapes.py on the GPU machine: extraction (speculators' loop, the fast path, the fast path
# with the states on the GPU) against plain prefill at several batch shapes on one pair of engines, one traced call
# of each per shape. After call 1 of a bundle (see h200_env.sh); carry its other parts and .whl.
#   SHAPE (llama1b4), BATCHES (the benchmark's default), PAIRS (5), MAX_LEN (4096); extra arguments go to it.
# The result in $OUT/gpu/<date>-batch-shapes-<shape>-<vllm tag>.json, its log beside it.
set -uo pipefail
. suites/gpu/h200_env.sh
name="$(date +%F)-batch-shapes-${SHAPE:-llama1b4}-$VLLM_TAG"
args=(--shape "${SHAPE:-llama1b4}" --pairs "${PAIRS:-5}" --max-model-len "${MAX_LEN:-4096}" --trace --device-output)
[ -n "${BATCHES:-}" ] && args+=(--batches "$BATCHES")
timeout "${SHAPES_TIMEOUT:-540}" "$PY" benchmarks/gpu_batch_shapes.py "${args[@]}" "$@" --out "$OUT/gpu/$name.json" \
  > "$OUT/gpu/$name.log" 2>&1
rc=$?
grep -E "^\[|^    (plain|fast|loop)|Error|error" "$OUT/gpu/$name.log" | grep -v '^(' | cut -c1-300 | tail -40
rm -rf "$HARNESS_CACHE_DIR"/bench-*
exit $rc
