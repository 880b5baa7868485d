#!/usr/bin/env bash
# The narrow GEMM with its weights streamed through a shared-memory ring (cp.async, RING - 1
# tiles in flight) against the version that loaded them into registers (issue 15), one
# device call on one GPU; both binaries built here from the two commits.
#  1. gpu_ops -o gemm_f16 (new): every narrow kernel (both layouts, 8/16/32 tokens a
#     block, split and not, ragged shapes) against its CPU twin;
#  2. gpu_ops perf -o gemm_f16, old and new: microseconds a launch;
#  3. Llama-3-8B-shape Q4_K (smelt synth), 16, 32 and 64 sequences (128-token prompts, 64
#     steps), old and new smelt interleaved, ROUNDS rounds (default 2), greedy digests
#     compared (the same products in the same order: they must be equal);
#  4. a 32-sequence step's timeline (SMELT_CUDA_TIMELINE=1), new.
#
# Here:  build smelt and the gpu_ops example at both commits, strip + gzip into the
#        git-ignored .gpu-r/ (smelt.gz, gpu_ops.gz new; smelt-base.gz, gpu_ops-base.gz)
# There: timeout 590 bash bench/gpu/ring.sh    carry [".gpu-r"]
# Log: $OUT/ring.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/ring.log"
B=/tmp/ring-bin
mkdir -p $B
for b in smelt gpu_ops smelt-base gpu_ops-base; do
  gunzip -c .gpu-r/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
M8=/tmp/ring-8b.gguf
($B/smelt synth --shape llama3-8b --quant q4_k -o $M8 > /tmp/ring-synth.log 2>&1) &
synpid=$!
table=()

echo "== 1. gpu_ops -o gemm_f16 (new)" | tee -a "$log"
timeout 150 $B/gpu_ops -o gemm_f16 > /tmp/ring-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/ring-ops.out >> "$log"
table+=("| gpu_ops -o gemm_f16 (narrow ring vs the twin) | $r, $(grep -c narrow /tmp/ring-ops.out) narrow lines, $(grep -c FAIL /tmp/ring-ops.out) FAIL |")
echo "== 2. gpu_ops perf -o gemm_f16, base then new" | tee -a "$log"
timeout 120 $B/gpu_ops-base perf -o gemm_f16 > /tmp/ring-perf-base.out 2>&1
timeout 120 $B/gpu_ops perf -o gemm_f16 > /tmp/ring-perf.out 2>&1
{ echo "-- base"; cat /tmp/ring-perf-base.out; echo "-- new"; cat /tmp/ring-perf.out; } >> "$log"
wait $synpid

echo "== 3. batched decode, base vs new" | tee -a "$log"
declare -A res dig
for round in $(seq 1 "${ROUNDS:-2}"); do
  for bt in 16 32 64; do
    for v in base new; do
      bin=$B/smelt
      [ $v = base ] && bin=$B/smelt-base
      j=$($bin bench --model $M8 --device cuda --prompt 128 --gen 64 --reps 1 --batch $bt --json 2>>"$log" | tr -d '\n')
      echo "round $round batch $bt $v: $j" >> "$log"
      t=$(echo "$j" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
      d=$(echo "$j" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
      echo "round $round batch $bt $v: $t tok/s, digests $d" | tee -a "$log"
      res[$bt-$v]="${res[$bt-$v]:-} ${t%.*}"
      dig[$bt-$v]="${dig[$bt-$v]:-} $d"
    done
  done
done
for bt in 16 32 64; do
  for v in base new; do
    table+=("| llama3-8b Q4_K, $bt sequences, $v: aggregate decode tok/s | ${res[$bt-$v]} (digests ${dig[$bt-$v]}) |")
  done
done

echo "== 4. timeline, 32 sequences, new" | tee -a "$log"
SMELT_CUDA_TIMELINE=1 $B/smelt bench --model $M8 --device cuda --prompt 128 --gen 64 --reps 1 --batch 32 > /tmp/ring-tl.out 2>&1
cat /tmp/ring-tl.out >> "$log"
echo "done at $SECONDS s" | tee -a "$log"
echo
echo "== perf (Q4_K rows), base"; grep "^| Q4_K" /tmp/ring-perf-base.out | head -16
echo "== perf (Q4_K rows), new"; grep "^| Q4_K" /tmp/ring-perf.out | head -16
echo "== timeline"; grep -A14 "CUDA timeline" /tmp/ring-tl.out
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${table[@]}"
