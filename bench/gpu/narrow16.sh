#!/usr/bin/env bash
# The narrow GEMM in warps of 16 rows against warps of 32 (issue 15), one device call on
# one GPU. Nsight Compute on the 32-row warps (bench/RESULTS.md, 2026-11-27 09:45 UTC): 255
# registers, 8 warps an SM, one instruction a warp every 7 cycles, a quarter of the issue
# slots used; the 16-row layout fits 128 registers, so 16 warps an SM.
#  1. gpu_ops -o gemm_f16: every narrow kernel (both layouts, 8/16/32 tokens a block, split
#     and not, ragged shapes) against its CPU twin;
#  2. gpu_ops perf -o gemm_f16: microseconds a launch, both layouts beside the other GEMMs;
#  3. Llama-3-8B-shape Q4_K (smelt synth), 16 and 32 sequences (128-token prompts, 64
#     steps), SMELT_CUDA_GEMM_NARROW_ROWS unset / 32 / 16, interleaved, ROUNDS rounds
#     (default 2), greedy digests compared;
#  4. a 32-sequence step's timeline (SMELT_CUDA_TIMELINE=1) with 16-row warps.
#
# Here:  cargo build --release -p smelt --bin smelt -p smelt-kernels --example gpu_ops, then
#        strip + gzip both into the git-ignored .gpu-b/ (smelt.gz, gpu_ops.gz)
# There: timeout 590 bash bench/gpu/narrow16.sh    carry [".gpu-b"]
# Log: $OUT/narrow16.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/narrow16.log"
B=/tmp/n16-bin
mkdir -p $B
for b in smelt gpu_ops; do
  gunzip -c .gpu-b/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
M8=/tmp/n16-8b.gguf
($B/smelt synth --shape llama3-8b --quant q4_k -o $M8 > /tmp/n16-synth.log 2>&1) &
synpid=$!
table=()

echo "== 1. gpu_ops -o gemm_f16" | tee -a "$log"
timeout 150 $B/gpu_ops -o gemm_f16 > /tmp/n16-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/n16-ops.out >> "$log"
table+=("| gpu_ops -o gemm_f16 (both narrow layouts vs the twin) | $r, $(grep -c narrow /tmp/n16-ops.out) narrow lines, $(grep -c FAIL /tmp/n16-ops.out) FAIL |")
echo "== 2. gpu_ops perf -o gemm_f16" | tee -a "$log"
timeout 150 $B/gpu_ops perf -o gemm_f16 > /tmp/n16-perf.out 2>&1
cat /tmp/n16-perf.out >> "$log"
wait $synpid

echo "== 3. batched decode, layouts A/B" | tee -a "$log"
declare -A res dig
for round in $(seq 1 "${ROUNDS:-2}"); do
  for bt in 16 32; do
    for rows in default 32 16; do
      env_=()
      [ $rows = default ] || env_=(SMELT_CUDA_GEMM_NARROW_ROWS=$rows)
      j=$(env "${env_[@]}" $B/smelt bench --model $M8 --device cuda --prompt 128 --gen 64 --reps 1 --batch $bt --json 2>>"$log" | tr -d '\n')
      echo "round $round batch $bt rows $rows: $j" >> "$log"
      v=$(echo "$j" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
      d=$(echo "$j" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
      echo "round $round batch $bt rows $rows: $v tok/s, digests $d" | tee -a "$log"
      res[$bt-$rows]="${res[$bt-$rows]:-} ${v%.*}"
      dig[$bt-$rows]="${dig[$bt-$rows]:-} $d"
    done
  done
done
for bt in 16 32; do
  for rows in default 32 16; do
    table+=("| llama3-8b Q4_K, $bt sequences, warps of $rows rows: aggregate tok/s | ${res[$bt-$rows]} (digests ${dig[$bt-$rows]}) |")
  done
done

echo "== 4. timeline, 32 sequences, 16-row warps" | tee -a "$log"
SMELT_CUDA_GEMM_NARROW_ROWS=16 SMELT_CUDA_TIMELINE=1 $B/smelt bench --model $M8 --device cuda --prompt 128 --gen 64 --reps 1 --batch 32 > /tmp/n16-tl.out 2>&1
cat /tmp/n16-tl.out >> "$log"
echo "done at $SECONDS s" | tee -a "$log"
echo
echo "== perf (narrow rows)"; grep "^| Q4_K" /tmp/n16-perf.out | head -20
echo "== timeline"; grep -A14 "CUDA timeline" /tmp/n16-tl.out
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${table[@]}"
