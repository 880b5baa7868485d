#!/usr/bin/env bash
# Where the narrow GEMM (weights through a cp.async ring) should take over, now that it is
# 1.4-1.5x faster than at its last tuning (issue 15), one device call on one GPU:
#  1. gpu_ops -o gemm_f16: every narrow kernel (both layouts, 8/16/32 tokens a block,
#     split and not, ragged shapes) against its CPU twin;
#  2. gpu_ops perf -o gemm_f16: microseconds a launch beside the other GEMMs;
#  3. Llama-3-8B-shape Q4_K (smelt synth), whole decode steps (128-token prompts, 64 steps),
#     each batch with the engine's default and the alternatives, interleaved, ROUNDS rounds
#     (default 2), greedy digests compared: 8 sequences on the GEMV (default) or the narrow
#     GEMM (SMELT_CUDA_GEMM_MIN=8) in either layout; 16 and 32 in 32-row warps
#     (SMELT_CUDA_GEMM_NARROW_ROWS=32) against the default 16; 64 and 128 on the other GEMMs
#     (default) or the narrow one (SMELT_CUDA_GEMM_NARROW_MAX=128).
#
# Here:  cargo build --release -p smelt --bin smelt -p smelt-kernels --example gpu_ops, then
#        strip + gzip both into the git-ignored .gpu-t/ (smelt.gz, gpu_ops.gz)
# There: timeout 590 bash bench/gpu/narrow_tune.sh    carry [".gpu-t"]
# Log: $OUT/narrow_tune.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/narrow_tune.log"
B=/tmp/tune-bin
mkdir -p $B
for b in smelt gpu_ops; do
  gunzip -c .gpu-t/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
M8=/tmp/tune-8b.gguf
($B/smelt synth --shape llama3-8b --quant q4_k -o $M8 > /tmp/tune-synth.log 2>&1) &
synpid=$!
table=()

echo "== 1. gpu_ops -o gemm_f16" | tee -a "$log"
timeout 150 $B/gpu_ops -o gemm_f16 > /tmp/tune-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/tune-ops.out >> "$log"
table+=("| gpu_ops -o gemm_f16 (narrow ring vs the twin) | $r, $(grep -c narrow /tmp/tune-ops.out) narrow lines, $(grep -c FAIL /tmp/tune-ops.out) FAIL |")
echo "== 2. gpu_ops perf -o gemm_f16" | tee -a "$log"
timeout 150 $B/gpu_ops perf -o gemm_f16 > /tmp/tune-perf.out 2>&1
cat /tmp/tune-perf.out >> "$log"
wait $synpid

echo "== 3. batched decode" | tee -a "$log"
declare -A res dig
cases=(
  "8 default"
  "8 SMELT_CUDA_GEMM_MIN=8"
  "8 SMELT_CUDA_GEMM_MIN=8,SMELT_CUDA_GEMM_NARROW_ROWS=16"
  "16 default"
  "16 SMELT_CUDA_GEMM_NARROW_ROWS=32"
  "32 default"
  "32 SMELT_CUDA_GEMM_NARROW_ROWS=32"
  "64 default"
  "64 SMELT_CUDA_GEMM_NARROW_MAX=128"
  "128 default"
  "128 SMELT_CUDA_GEMM_NARROW_MAX=128"
)
for round in $(seq 1 "${ROUNDS:-2}"); do
  for c in "${cases[@]}"; do
    set -- $c
    bt=$1
    env_=()
    [ "$2" = default ] || IFS=, read -ra env_ <<< "$2"
    j=$(env "${env_[@]}" $B/smelt bench --model $M8 --device cuda --prompt 128 --gen 64 --reps 1 --batch $bt --json 2>>"$log" | tr -d '\n')
    echo "round $round $c: $j" >> "$log"
    v=$(echo "$j" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
    d=$(echo "$j" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
    echo "round $round $c: $v tok/s, digests $d" | tee -a "$log"
    res[$c]="${res[$c]:-} ${v%.*}"
    dig[$c]="${dig[$c]:-} $d"
  done
done
for c in "${cases[@]}"; do
  table+=("| llama3-8b Q4_K, batch/setting $c: aggregate decode tok/s | ${res[$c]} (digests ${dig[$c]}) |")
done
echo "done at $SECONDS s" | tee -a "$log"
echo
echo "== perf (Q4_K rows)"; grep "^| Q4_K" /tmp/tune-perf.out | head -16
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${table[@]}"
