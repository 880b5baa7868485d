#!/usr/bin/env bash
# The narrow GEMM for Q8_0 (issue 15's Q8_0 row) against the int8 GEMM it replaces, one
# device call on one GPU, short enough for the end of a session's device time:
#  1. gpu_ops -o gemm_f16: every narrow kernel (Q4_K, Q6_K, Q8_0; both layouts, 8/16/32
#     tokens a block, ragged shapes, split and not, fix-up both ways) against its CPU twin;
#  2. Llama-3-8B shape Q8_0 (smelt synth), whole decode steps (128-token prompts, 64
#     steps) of 16, 32 and 64 sequences, the base smelt (Q8_0 on the int8 GEMM) and the
#     new one interleaved, ROUNDS rounds (default 1).
#
# Here:  cargo build --release -p smelt --bin smelt -p smelt-kernels --example gpu_ops, then
#        strip + gzip into the git-ignored .gpu-8/ (smelt.gz, gpu_ops.gz; smelt-base.gz
#        from the commit before)
# There: timeout 400 bash bench/gpu/narrow_q8_0.sh    carry [".gpu-8"]
# Log: $OUT/narrow_q8_0.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/narrow_q8_0.log"
B=/tmp/q8-bin
mkdir -p $B
for b in smelt gpu_ops smelt-base; do
  gunzip -c .gpu-8/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
M=/tmp/q8-8b.gguf
($B/smelt synth --shape llama3-8b --quant q8_0 -o $M > /tmp/q8-synth.log 2>&1) &
synpid=$!
table=()
echo "== 1. gpu_ops -o gemm_f16" | tee -a "$log"
timeout 150 $B/gpu_ops -o gemm_f16 > /tmp/q8-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/q8-ops.out >> "$log"
table+=("| gpu_ops -o gemm_f16 (narrow Q4_K, Q6_K, Q8_0 vs the twin) | $r, $(grep -c 'narrow.*q8_0' /tmp/q8-ops.out) Q8_0 narrow lines, $(grep -c FAIL /tmp/q8-ops.out) FAIL |")
wait $synpid
cat /tmp/q8-synth.log >> "$log"
echo "== 2. batched decode, base vs new" | tee -a "$log"
declare -A res
for round in $(seq 1 "${ROUNDS:-1}"); do
  for bt in 16 32 64; do
    for v in base new; do
      bin=$B/smelt
      [ $v = base ] && bin=$B/smelt-base
      j=$($bin bench --model $M --device cuda --prompt 128 --gen 64 --reps 1 --batch $bt --json 2>>"$log" | tr -d '\n')
      echo "round $round batch $bt $v: $j" >> "$log"
      t=$(echo "$j" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
      echo "round $round batch $bt $v: $t tok/s" | tee -a "$log"
      res[$bt-$v]="${res[$bt-$v]:-} ${t%.*}"
    done
  done
done
for bt in 16 32 64; do
  table+=("| llama3-8b q8_0, $bt sequences: base / new aggregate decode tok/s | ${res[$bt-base]} / ${res[$bt-new]} |")
done
echo "done at $SECONDS s" | tee -a "$log"
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${table[@]}"
