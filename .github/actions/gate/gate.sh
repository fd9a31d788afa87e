#!/usr/bin/env bash
# The gate as a downstream repository runs it: the composite action's one step (action.yml beside this file) and
# the reusable workflow's (.github/workflows/gate-call.yml). Installs this harness (the folder three levels up)
# with its [gate] extra into a virtual environment, reads the team's pin from its lock file unless GATE_FROM is
# given, judges the bump to GATE_TO (default: the newest vLLM release on the index), and leaves the verdict in
# $GITHUB_OUTPUT and the Markdown in $GITHUB_STEP_SUMMARY (a refusal too: verdict=REFUSED and its one line). Exit: the gate's (0 safe or covered, 1 needs a new shim
# or broken, 2 refused or undecided, 3 REVIEW: code on a watched path changed that no check classifies).
#   GATE_LOCK_FILE  uv.lock, poetry.lock, pylock.toml, requirements*.txt or pyproject.toml pinning vllm==X (and
#                   speculators==Y: >= 0.5 gates that release's client path)
#   GATE_BASE_REF   in a pull request: the base's git ref; its GATE_LOCK_FILE's pins are judged against the head's
#   GATE_FROM       the vLLM the team runs now (instead of a lock file)
#   GATE_TO         the candidate (a version, wheel, sdist, folder or index URL; default the newest release)
#   GATE_CLIENT     speculators==X.Y.Z to gate that client's path over vllm serve (default: 0.3.0's generator)
#   GATE_ALLOWLIST  the team's allow-list TOML (default: the harness's fixtures/gate/allowlist.toml)
#   GATE_MODEL_CONFIG  the target checkpoint's config.json: decides the findings that depend on the model
#   GATE_INDEX_URL  the simple index vLLM is read from (default: PyPI, or what uv/pip are configured with)
#   GATE_JSON       where the JSON report goes (default $RUNNER_TEMP/gate.json)
#   HARNESS_VENV    the virtual environment to use or create (default $RUNNER_TEMP/harness-gate-venv)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
tmp="${RUNNER_TEMP:-${TMPDIR:-/tmp}}"
venv="${HARNESS_VENV:-$tmp/harness-gate-venv}"
if [ ! -x "$venv/bin/harness" ]; then
  if command -v uv >/dev/null 2>&1; then
    uv venv --quiet --python "${GATE_PYTHON:-python3}" "$venv"
    uv pip install --quiet --python "$venv/bin/python" "${root}[gate]"
  else
    "${GATE_PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "${root}[gate]"
  fi
fi
py="$venv/bin/python"
[ -z "${GATE_INDEX_URL:-}" ] || export HARNESS_PYPI_URL="$GATE_INDEX_URL"  # every lookup of vLLM below reads it
artifact() {  # a name for the report's artifact that two calls with other inputs do not share
  printf 'gate-report-%s-%s%s' "${from:-lock}" "${to:-newest}" "${GATE_CLIENT:+-$GATE_CLIENT}" | tr -c 'A-Za-z0-9._=+-' '_'
}
refuse() {  # the reason: one line on stderr, in the job summary and in the outputs; exit 2
  echo "gate: $1" >&2
  [ -z "${GITHUB_STEP_SUMMARY:-}" ] || printf '## speculators x vLLM gate: REFUSED\n\n%s\n' "$1" >> "$GITHUB_STEP_SUMMARY"
  [ -z "${GITHUB_OUTPUT:-}" ] || { echo "verdict=REFUSED"; echo "reason=$1"; echo "artifact=$(artifact)"; } >> "$GITHUB_OUTPUT"
  exit 2
}
last_line() { tail -n 1 "$1" 2>/dev/null | sed 's/^harness[.a-z]*: //'; }
from="${GATE_FROM:-}"
to=""
base=""
if [ -n "${GATE_BASE_REF:-}" ]; then  # a pull request: the base's pin against the head's
  [ -n "${GATE_LOCK_FILE:-}" ] || refuse "base-ref / GATE_BASE_REF needs the lock file (lock-file / GATE_LOCK_FILE)"
  base="$tmp/gate-base-$(basename "$GATE_LOCK_FILE")"
  git show "$GATE_BASE_REF:./$GATE_LOCK_FILE" > "$base" 2> "$tmp/gate-git.err" ||
    refuse "the base ref $GATE_BASE_REF has no $GATE_LOCK_FILE ($(last_line "$tmp/gate-git.err")); check out with fetch-depth: 0"
  from=$("$py" -m harness.gate.obtain.pin "$base" 2> "$tmp/gate-pin.err") || refuse "base: $(last_line "$tmp/gate-pin.err")"
  to=$("$py" -m harness.gate.obtain.pin "$GATE_LOCK_FILE" 2> "$tmp/gate-pin.err") || refuse "head: $(last_line "$tmp/gate-pin.err")"
elif [ -z "$from" ]; then
  [ -n "${GATE_LOCK_FILE:-}" ] ||
    refuse "give the vLLM you run now: a lock file (lock-file / GATE_LOCK_FILE) or a version (from / GATE_FROM)"
  from=$("$py" -m harness.gate.obtain.pin "$GATE_LOCK_FILE" 2> "$tmp/gate-pin.err") || refuse "$(last_line "$tmp/gate-pin.err")"
fi
[ -n "$to" ] || to="${GATE_TO:-}"
[ -n "$to" ] || to=$("$py" -m harness.gate.obtain.pin --newest 2> "$tmp/gate-pin.err") || refuse "$(last_line "$tmp/gate-pin.err")"
out="${GATE_JSON:-$tmp/gate.json}"
args=(gate --from "$from" --to "$to" --json "$out")
# The lock file also pins speculators: its release chooses the path judged (unless GATE_CLIENT names one).
if [ -n "$base" ]; then
  args=(gate --base-lockfile "$base" --lockfile "$GATE_LOCK_FILE" --json "$out")
elif [ -z "${GATE_FROM:-}" ]; then
  args+=(--lockfile "$GATE_LOCK_FILE")
fi
[ -z "${GATE_CLIENT:-}" ] || args+=(--client "$GATE_CLIENT")
[ -z "${GATE_ALLOWLIST:-}" ] || args+=(--allowlist "$GATE_ALLOWLIST")
[ -z "${GATE_MODEL_CONFIG:-}" ] || args+=(--model-config "$GATE_MODEL_CONFIG")
[ -z "${GITHUB_STEP_SUMMARY:-}" ] || args+=(--summary "$GITHUB_STEP_SUMMARY")
echo "gate: vLLM $from -> $to${GATE_CLIENT:+ ($GATE_CLIENT)}"
rc=0
rm -f "$out"
"$venv/bin/harness" "${args[@]}" 2> >(tee "$tmp/gate.err" >&2) || rc=$?
wait  # for tee
[ "$rc" -ne 2 ] || [ -s "$out" ] || refuse "$(last_line "$tmp/gate.err")"
verdict=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["verdict"])' "$out" 2>/dev/null || echo UNDECIDED)
if [ -n "${GATE_LOCK_FILE:-}" ] && [ -n "${GITHUB_ACTIONS:-}" ]; then  # an annotation on the lock file's vLLM line
  line=$(grep -n -m1 -E '(name = "vllm(-cpu)?")|(^|["[:space:]])vllm(-cpu)?[[:space:]]*(==|@)' "$GATE_LOCK_FILE" | cut -d: -f1)
  case "$verdict" in SAFE|NEEDS-SHIM-AND-COVERED) level=notice ;; REVIEW|UNDECIDED) level=warning ;; *) level=error ;; esac
  echo "::$level file=$GATE_LOCK_FILE,line=${line:-1},title=speculators x vLLM gate::$verdict: vLLM $from -> $to"
fi
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  { echo "verdict=$verdict"; echo "from=$from"; echo "to=$to"; echo "report=$out"; echo "artifact=$(artifact)"; } >> "$GITHUB_OUTPUT"
fi
exit "$rc"
