#!/usr/bin/env bash
# The GPU tier's proof run on this project's H200 machine (no network, torch 2.11+cu130, no vLLM).
#
# Call 1 (carry .gpu-part1):            bash .gpu-part1/install_part1.sh
# Call 2 (carry .gpu-part2 and .whl):   bash suites/gpu/h200_proof.sh [TP]
# .gpu-part1/.gpu-part2 are copies of shared/gpu-bundle/vllm-0.20.0/part{1,2}; .whl holds the
# speculators 0.3.0, loguru and compressed-tensors 0.15.0.1 wheels (pip download --no-deps; vLLM's
# Kimi-K2.5 model imports compressed_tensors, which the bundle lacks). Results go to $OUT (device tool).
set -uo pipefail
TP="${1:-1}"
MODELS="${2:-kimi llama}"  # which of the two tiny models to run; "native" adds the native-export cross-check
# NATIVE_MODELS="tiny-llama:240 tiny-deepseek-v3:170": models[:timeout s] for suites/native (float32, our generator vs vLLM's export)
. suites/gpu/h200_env.sh
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
paths=$("$PY" -c "from harness.subjects import models; print(models.build('tiny-kimi-k25').path, models.build('tiny-llama').path)") || exit 6
read -r KIMI LLAMA <<< "$paths"
rc=0
case " $MODELS " in *" kimi "*) ;; *) KIMI="";; esac
case " $MODELS " in *" llama "*) ;; *) LLAMA="";; esac
# tiny-Kimi: KimiK25ForConditionalGeneration, real MLA on TRITON_MLA (bf16 only there), speculators' own layer ids.
[ -n "$KIMI" ] && { timeout "${KIMI_TIMEOUT:-330}" "$PY" -m harness gpu-nightly --model-path "$KIMI" --tp "$TP" --dtype bfloat16 --attention-backend TRITON_MLA \
  --gpu-memory-utilization 0.3 --report-dir "$OUT/gpu" --env "gpu-$VLLM_TAG-kimi" -- -q -rA --harness-report-dir "$OUT/env" > "$OUT/kimi.log" 2>&1 || rc=$?; tail -25 "$OUT/kimi.log"; }
[ -n "$LLAMA" ] && { timeout "${LLAMA_TIMEOUT:-260}" "$PY" -m harness gpu-nightly --model-path "$LLAMA" --tp "$TP" --dtype bfloat16 --attention-backend TRITON_ATTN \
  --gpu-memory-utilization 0.3 --report-dir "$OUT/gpu" --env "gpu-$VLLM_TAG-llama" -- -q -rA --harness-report-dir "$OUT/env" > "$OUT/llama.log" 2>&1 || rc=$((rc ? rc : $?)); tail -25 "$OUT/llama.log"; }
# The native-export cross-check (suites/native) on CUDA, held to fixtures/expectations/vllm-0.20.0-cuda.toml:
# one pytest session per model (a model that cannot start must not cost the others their report).
case " $MODELS " in *" native "*)
  for tok in ${NATIVE_MODELS:-tiny-llama:240}; do  # model[:timeout seconds]
    m="${tok%%:*}"; t="${tok#*:}"; [ "$t" = "$tok" ] && t=240
    timeout "$t" "$PY" -m pytest suites/native -k "$m or path_contract" -q -rA -p no:cacheprovider \
      --harness-env "native-$m" --harness-report-dir "$OUT/native" > "$OUT/native-$m.log" 2>&1 || rc=$((rc ? rc : $?))
    grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|^E  " "$OUT/native-$m.log" | cut -c1-400 | tail -25
  done
  rm -f "$OUT"/native/*.md; tar czf "$OUT/native-logs.tgz" -C "$OUT" $(cd "$OUT" && ls native-*.log) && rm -f "$OUT"/native-*.log;;
esac
exit $rc
