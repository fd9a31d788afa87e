#!/usr/bin/env bash
# The GPU tier (`harness gpu-nightly`, throughput against plain prefill included) on a checkpoint given by path,
# as the users' nightly runs it on theirs: here a real-shape random checkpoint built on the machine (the GPU
# benchmark's shapes; never carried), after call 1 (see h200_env.sh).
# bash suites/gpu/h200_tier_shape.sh SHAPE [gpu-nightly args...]; reports under $OUT/gpu.
set -uo pipefail
SHAPE="$1"; shift
. suites/gpu/h200_env.sh
path=$("$PY" -c "
import sys; sys.path.insert(0, 'benchmarks')
import gpu_shapes as g
from harness.subjects import models
print(models.build('bench-$SHAPE', fixture=g.shape_fixture('$SHAPE')).path)") || exit 6
timeout 500 "$PY" -m harness gpu-nightly --model-path "$path" --tp 1 --dtype bfloat16 --gpu-memory-utilization 0.4 \
  --report-dir "$OUT/gpu" --env "gpu-vllm020-$SHAPE" "$@" -- -q -rA > "$OUT/tier-$SHAPE.log" 2>&1
rc=$?
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|Against plain|^E  " "$OUT/tier-$SHAPE.log" | cut -c1-400 | tail -25
rm -rf "$HARNESS_CACHE_DIR"/bench-*
exit $rc
