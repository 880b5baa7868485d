#!/usr/bin/env bash
# Decode speed on a shared CPU (issue 21): tokens/s of `smelt bench` with the machine to
# itself and with BUSY competing processes that each keep one core busy, for the default
# thread count and for each `--threads` in THREADS. Each binary given is measured in the same
# run, alternating, so a before/after pair sees the same machine.
# Usage: bench/cpu/busy.sh [SMELT_BINARY...]   (default: the release build of this tree)
# Env: MODEL (smollm2-135m), GEN (64 decode tokens), REPS (3, median), BUSY (1),
#      THREADS ("1 2").
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
model=${MODEL:-smollm2-135m}
gen=${GEN:-64}
reps=${REPS:-3}
busy=${BUSY:-1}
threads_list=${THREADS:-1 2}
if [ $# -eq 0 ]; then
  cargo build --release -q -p smelt
  set -- "${CARGO_TARGET_DIR:-$root/target}/release/smelt"
fi

hogs=()
stop_hogs() {
  local p
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${hogs[@]}"; do wait "$p" 2>/dev/null || true; done
  hogs=()
}
trap stop_hogs EXIT
start_hogs() {
  local i
  for ((i = 0; i < busy; i++)); do
    bash -c 'while :; do :; done' &
    hogs+=("$!")
  done
}

# decode tok/s (median of REPS) of one binary with optional --threads
measure() {
  local bin=$1 t=$2 args=(bench --model "$model" --device cpu --prompt 16 --gen "$gen" --reps "$reps" --json)
  [ "$t" != default ] && args+=(--threads "$t")
  "$bin" "${args[@]}" 2>/dev/null | python3 -c 'import json,sys; print("%.1f" % json.loads(sys.stdin.read().strip().splitlines()[-1])["decode_tok_s"])'
}

echo "# $(date -u '+%F %H:%M UTC'), $(nproc) CPUs, model $model, tg$gen, median of $reps"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| binary | threads | idle tok/s | %d busy process(es) tok/s |\n|---|---|---:|---:|\n' "$busy"
for t in default $threads_list; do
  for bin in "$@"; do
    idle=$(measure "$bin" "$t")
    start_hogs
    loaded=$(measure "$bin" "$t")
    stop_hogs
    printf '| %s | %s | %s | %s |\n' "$bin" "$t" "$idle" "$loaded"
  done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
