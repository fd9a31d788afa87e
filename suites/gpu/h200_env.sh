# shellcheck shell=bash
# Sourced by the H200 scripts: vLLM into /tmp/site (once per machine: a marker file says it is done), then the
# environment every run there needs. Two ways in:
# - BUNDLE=build/gpu-bundle/vllm-X.Y.Z (made by `python -m harness.gpu.bundle X.Y.Z`): every part carried in this
#   call is staged; a call that completes the bundle installs it. Earlier calls run `bash $BUNDLE/partK/install.sh`.
# - unset: the shared vLLM 0.20.0 bundle. Call 1 on a fresh machine (carry .gpu-part1) runs
#   `bash .gpu-part1/install_part1.sh`; the next call (carry .gpu-part2 and .whl) sources this.
# .whl (speculators 0.3.0 and what the bundle lacks) is installed over it either way.
SITE=/tmp/site
PY="${PY:-/opt/torch/.venv/bin/python3}"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/gpu"
if [ -n "${BUNDLE:-}" ]; then
  brc=10
  for part in "$BUNDLE"/part*/install.sh; do
    [ -e "$part" ] || continue
    bash "$part" >> "$OUT/install.log" 2>&1; brc=$?
    [ $brc -eq 10 ] || break
  done
  tail -3 "$OUT/install.log"
  [ $brc -eq 0 ] || { echo "the bundle in $BUNDLE is not installed (exit $brc): carry its other parts"; exit 3; }
elif [ ! -e "$SITE/.harness-part2-done" ]; then
  [ -d "$SITE/pydantic" ] || { echo "part 1 is not installed in $SITE (a fresh machine): run call 1 again"; exit 3; }
  bash .gpu-part2/install_part2.sh > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 4; }
  touch "$SITE/.harness-part2-done"
fi
if [ ! -e "$SITE/.harness-whl-done" ]; then
  "$PY" -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 5
  touch "$SITE/.harness-whl-done"
fi
export PYTHONPATH="$SITE:$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
export VLLM_WORKER_MULTIPROC_METHOD=spawn NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HARNESS_CACHE_DIR=/tmp/harness-models
# A bundle made by harness.gpu.bundle carries no FlashInfer (see its OPTIONAL); vLLM >= 0.22 imports it for top-k/p
# sampling unless told not to (the hidden states never pass the sampler).
[ -n "${BUNDLE:-}" ] && export VLLM_USE_FLASHINFER_SAMPLER=0
# The tier's env names carry the release: gpu-vllm020-..., gpu-vllm022-...
export VLLM_TAG  # read by the scripts that source this file
VLLM_TAG=$(PYTHONPATH="$SITE" "$PY" -c "import vllm; a, b = vllm.__version__.split('.')[:2]; print(f'vllm{a}{int(b):02d}')" 2>/dev/null || echo vllm)
