#!/usr/bin/env bash
# Extraction vs plain prefill on the H200 at a real shape (benchmarks/gpu_extraction_profile.py), after
# call 1 (see h200_env.sh). bash suites/gpu/h200_bench.sh SHAPE [benchmark args...]; the report lands in
# $OUT/gpu/<date>-extraction-<shape>-vllm020.json, the log beside it. The checkpoint is built here (never
# carried) and removed afterwards (the disk holds one real-shape checkpoint at a time).
set -uo pipefail
SHAPE="$1"; shift
. suites/gpu/h200_env.sh
df -h /dev/shm /tmp | tail -2; nproc; free -g | head -2
name="$(date +%F)-extraction-$SHAPE-vllm020"
"$PY" benchmarks/gpu_extraction_profile.py --shape "$SHAPE" --out "$OUT/gpu/$name.json" "$@" > "$OUT/gpu/$name.log" 2>&1
rc=$?
grep -vE "^\(|INFO|WARNING|it/s\]|Loading safetensors" "$OUT/gpu/$name.log" | tail -60
rm -rf "$HARNESS_CACHE_DIR"/bench-*
exit $rc
