# Sourced by the H200 scripts: the vLLM 0.20.0 bundle's second half and the extra wheels into /tmp/site
# (once per machine: a marker file says it is done), then the environment every run there needs.
# Call 1 on a fresh machine (carry .gpu-part1) runs `bash .gpu-part1/install_part1.sh`; the next call
# (carry .gpu-part2 and .whl) sources this.
SITE=/tmp/site
PY="${PY:-/opt/torch/.venv/bin/python3}"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/gpu"
[ -d "$SITE/pydantic" ] || { echo "part 1 is not installed in $SITE (a fresh machine): run call 1 again"; exit 3; }
if [ ! -e "$SITE/.harness-part2-done" ]; then
  bash .gpu-part2/install_part2.sh > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 4; }
  "$PY" -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 5
  touch "$SITE/.harness-part2-done"
fi
export PYTHONPATH="$SITE:$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
export VLLM_WORKER_MULTIPROC_METHOD=spawn NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HARNESS_CACHE_DIR=/tmp/harness-models
