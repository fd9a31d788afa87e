#!/usr/bin/env bash
# harness.gpu.moe_order on the Kimi-K2.5 INT4 slice (LAYERS, default 3): the same batch twice, alone vs batch and
# fast vs loop, with vLLM's Marlin MoE token order and then the canonical one. After call 1 of a bundle (see
# h200_env.sh); carry the bundle's other parts and .whl. The result lands in $OUT/gpu/<date>-moe-order-*.json.
set -uo pipefail
. suites/gpu/h200_env.sh
"$PY" -m harness.gpu.seeded_loader --entry-point-into "$SITE" > /dev/null || exit 6
MODEL=$("$PY" -m harness.gpu.kimi_int4 --layers "${LAYERS:-3}") || exit 6
timeout "${ORDER_TIMEOUT:-480}" "$PY" -m harness.gpu.moe_order --model-path "$MODEL" \
  --gpu-memory-utilization "${GPU_UTIL:-0.45}" --out "$OUT/gpu/$(date +%F)-moe-order-$VLLM_TAG-$(basename "$MODEL").json" \
  > "$OUT/moe-order.log" 2>&1
rc=$?
grep -E "^(vllm_order|canonical_order)|Error|error" "$OUT/moe-order.log" | grep -v '^(' | cut -c1-600 | tail -20
exit $rc
